package trainer

import (
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"os"

	"github.com/gorovod/gorovod/tf/atomicfile"
	"github.com/gorovod/gorovod/tf/checkpoint"
)

// positionSuffix names the file beside a checkpoint's index and data shards that records where
// the training data stood when it was saved. A step whose gradients were not finite consumes a
// batch without advancing global_step, so the step alone does not say how far the data went.
const positionSuffix = ".input_position.json"

// inputPosition is what a resumed run needs to continue each rank's example stream exactly:
// the dataset is deterministic given its options, so the number of examples every rank drew
// (the same on all ranks: they step together) is enough, at the same number of ranks.
type inputPosition struct {
	// Batches is the number of batches each rank drew: at least the global step.
	Batches int64 `json:"batches"`
	// Examples is the number of examples each rank drew in them, and BatchSize the batch size
	// of the run that saved the file; 0 (unknown) in files written before they were recorded,
	// whose examples are Batches times the batch size of the run that reads them.
	Examples  int64 `json:"examples,omitempty"`
	BatchSize int   `json:"batch_size,omitempty"`
	// AccumulationSteps is the number of batches a step of the saving run summed; 0 in files
	// written before accumulation existed, whose runs summed 1.
	AccumulationSteps int `json:"accumulation_steps,omitempty"`
	// Ranks is the number of ranks that drew them, each from its own shard; 0 (unknown) in
	// files written before it was recorded.
	Ranks int `json:"ranks,omitempty"`
}

// examples is the number of examples each rank drew, those of a file that does not say reckoned
// at batchSize.
func (p inputPosition) examples(batchSize int) int64 {
	if p.Examples > 0 || p.Batches == 0 {
		return p.Examples
	}
	return p.Batches * int64(batchSize)
}

// withInputPosition extends the model's save with the input position pos. The checkpoint
// manager runs it in its temporary directory, so the position file is renamed into place with
// the data shards, before the index and the state file make the checkpoint visible, and
// retention deletes it with them.
func withInputPosition(save checkpoint.SaveFunc, pos inputPosition) checkpoint.SaveFunc {
	return func(prefix string) error {
		if err := save(prefix); err != nil {
			return err
		}
		b, _ := json.Marshal(pos)
		if err := os.WriteFile(prefix+positionSuffix, b, 0o644); err != nil {
			return fmt.Errorf("writing the input position: %w", err)
		}
		return nil
	}
}

// readInputPosition returns the position of the checkpoint prefix of global step step, for a run
// of batchSize examples a batch. A checkpoint without the file (one written before it existed,
// or by TensorFlow) falls back to one batch per step, exact when no update was skipped, drawn by
// an unknown number of ranks.
func readInputPosition(prefix string, step int64, batchSize int) (inputPosition, error) {
	path := prefix + positionSuffix
	b, err := os.ReadFile(path)
	if errors.Is(err, os.ErrNotExist) {
		return inputPosition{Batches: step}, nil
	}
	if err != nil {
		return inputPosition{}, fmt.Errorf("resume: %w", err)
	}
	var pos inputPosition
	if err := json.Unmarshal(b, &pos); err != nil {
		return inputPosition{}, fmt.Errorf("resume: %s: %w", path, err)
	}
	if pos.Batches < step {
		return inputPosition{}, fmt.Errorf("resume: %s says %d batches were drawn, fewer than the checkpoint's %d steps", path, pos.Batches, step)
	}
	if pos.Ranks < 0 || pos.Examples < 0 || pos.BatchSize < 0 {
		return inputPosition{}, fmt.Errorf("resume: %s says %d ranks drew %d examples in batches of %d", path, pos.Ranks, pos.Examples, pos.BatchSize)
	}
	// A file that does not count the examples has them reckoned at batchSize: a count past
	// int64 would wrap around to a negative number, and the data would not be skipped at all.
	if pos.Examples == 0 && pos.Batches > math.MaxInt64/int64(batchSize) {
		return inputPosition{}, fmt.Errorf("resume: %s says %d batches were drawn: at %d examples a batch, more examples than an int64 counts", path, pos.Batches, batchSize)
	}
	return pos, nil
}

// sizeChangeWarning is what a run of ranks ranks logs when it resumes from the checkpoint
// prefix that saved ranks drew from ("" when the sizes are equal, or the saved one is
// unknown). Horovod restores a checkpoint at any size (the state is broadcast from rank 0),
// and a user who lost a machine must be able to continue on the others, so this is a warning,
// not an error. But it is a different run from there on: the training steps and the peak
// learning rate are computed for the new size, and the training data is sharded anew, so that
// the per-rank position cannot be mapped onto the new shards. Each rank skips as many batches
// of its new shard as every rank had drawn (keeping drawn batches >= global steps, which the
// next resume checks); which examples come next differs from an uninterrupted run.
func sizeChangeWarning(prefix string, pos inputPosition, ranks int, examples int64) string {
	if pos.Ranks == 0 || pos.Ranks == ranks {
		return ""
	}
	return fmt.Sprintf("warning: %s was saved by a run of %d rank(s), this one has %d: the steps, the peak learning rate and the data shards follow the new size "+
		"(each rank skips %d examples of its new shard)", prefix, pos.Ranks, ranks, examples)
}

// batchChangeWarning is what a run of batch size batchSize per rank, accumulation batches a
// step, logs when it resumes from the checkpoint prefix saved at another ("" when they are
// equal, or the saved batch size is unknown): like Estimator, it goes on from the global step,
// and the steps and the learning rate follow the new size; the data continues after the
// examples each rank drew.
func batchChangeWarning(prefix string, pos inputPosition, batchSize, accumulation int) string {
	saved := max(1, pos.AccumulationSteps)
	if pos.BatchSize == 0 || pos.BatchSize == batchSize && saved == accumulation {
		return ""
	}
	return fmt.Sprintf("warning: %s was saved by a run of batch size %s per rank, this one has %s: the steps and the learning rate follow the new size, "+
		"and each rank's data continues after the %d examples it drew", prefix, stepBatch(pos.BatchSize, saved), stepBatch(batchSize, accumulation), pos.examples(batchSize))
}

// stepBatch names a rank's batch of a step: its size, and the batches accumulated if several.
func stepBatch(batchSize, accumulation int) string {
	if accumulation == 1 {
		return fmt.Sprint(batchSize)
	}
	return fmt.Sprintf("%d x %d accumulated", batchSize, accumulation)
}

// updatePosition brings the input position of the latest checkpoint up to drawn batches: an
// update skipped since it was saved (gradients not finite) drew a batch without a step, so the
// checkpoint's weights and slots are still this step's but its position is behind, and a run
// resumed from it would train on that batch again and on every later one a batch late.
func (t *Trainer) updatePosition(drawn inputPosition) error {
	prefix, step, _, err := t.ckpts.Latest()
	if err != nil {
		return err
	}
	pos, err := readInputPosition(prefix, step, t.opts.BatchSize)
	if err != nil || pos.Batches == drawn.Batches {
		return err
	}
	b, _ := json.Marshal(drawn)
	if err := atomicfile.Write(prefix+positionSuffix, b); err != nil {
		return fmt.Errorf("updating the input position of %s: %w", prefix, err)
	}
	t.infof("%s: %d batches drawn (updates skipped since it was saved)", prefix+positionSuffix, drawn.Batches)
	return nil
}
