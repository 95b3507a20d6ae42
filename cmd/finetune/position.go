package main

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"

	"github.com/gorovod/gorovod/bertgraph/tfrecord"
	"github.com/gorovod/gorovod/cmd/finetune/internal/checkpoint"
)

// positionSuffix names the file beside a checkpoint's index and data shards that records where
// the training data stood when it was saved. A step whose gradients were not finite consumes a
// batch without advancing global_step, so the step alone does not say how far the data went.
const positionSuffix = ".input_position.json"

// inputPosition is what a resumed run needs to continue each rank's example stream exactly:
// the dataset is deterministic given its options, so the number of batches every rank drew
// (the same on all ranks: they step together) is enough.
type inputPosition struct {
	Batches int64 `json:"batches"`
}

// withInputPosition extends the model's save with the input position of drawn batches. The
// checkpoint manager runs it in its temporary directory, so the position file is renamed into
// place with the data shards, before the index and the state file make the checkpoint visible,
// and retention deletes it with them.
func withInputPosition(save checkpoint.SaveFunc, drawn int64) checkpoint.SaveFunc {
	return func(prefix string) error {
		if err := save(prefix); err != nil {
			return err
		}
		b, _ := json.Marshal(inputPosition{Batches: drawn})
		if err := os.WriteFile(prefix+positionSuffix, b, 0o644); err != nil {
			return fmt.Errorf("writing the input position: %w", err)
		}
		return nil
	}
}

// readInputPosition returns the batches drawn before the checkpoint prefix of global step step
// was saved. A checkpoint without the file (one written before it existed, or by TensorFlow)
// falls back to one batch per step, exact when no update was skipped.
func readInputPosition(prefix string, step int64) (int64, error) {
	path := prefix + positionSuffix
	b, err := os.ReadFile(path)
	if errors.Is(err, os.ErrNotExist) {
		return step, nil
	}
	if err != nil {
		return 0, fmt.Errorf("resume: %w", err)
	}
	var pos inputPosition
	if err := json.Unmarshal(b, &pos); err != nil {
		return 0, fmt.Errorf("resume: %s: %w", path, err)
	}
	if pos.Batches < step {
		return 0, fmt.Errorf("resume: %s says %d batches were drawn, fewer than the checkpoint's %d steps", path, pos.Batches, step)
	}
	return pos.Batches, nil
}

// skipBatches advances ds past the records of batches batches of batchSize. Next reads and
// checks each record's framing but does not decode its features; the shuffle buffer needs the
// records themselves, so they cannot be seeked over.
func skipBatches(ds *tfrecord.Dataset, batches int64, batchSize int) error {
	for range batches * int64(batchSize) {
		if _, err := ds.Next(); err != nil {
			return err
		}
	}
	return nil
}
