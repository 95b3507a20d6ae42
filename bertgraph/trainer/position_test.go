package trainer

import (
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"

	"github.com/gorovod/gorovod/bertgraph/features"
	"github.com/gorovod/gorovod/bertgraph/tfrecord"
	"github.com/gorovod/gorovod/horovod"
	"github.com/gorovod/gorovod/tf/checkpoint"
	records "github.com/gorovod/gorovod/tf/tfrecord"
)

// writeRecords writes n training records whose first input id is their number.
func writeRecords(t *testing.T, path string, n int) {
	t.Helper()
	f, err := os.Create(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	w := records.NewWriter(f)
	for i := range n {
		rec := tfrecord.EncodeFeatures(features.InputFeatures{
			InputIDs: []int32{int32(100 + i), 1, 0, 0}, InputMask: []int32{1, 1, 0, 0},
			SegmentIDs: make([]int32, 4), LabelID: int32(i % 2), IsRealExample: true})
		if err := w.Write(rec); err != nil {
			t.Fatal(err)
		}
	}
}

// batchGUIDs draws count batches of ds and returns each one's record positions.
func batchGUIDs(t *testing.T, ds *tfrecord.Dataset, batchSize, count int) [][]string {
	t.Helper()
	var out [][]string
	for range count {
		b, err := ds.NextBatch(batchSize, 4, true)
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, b.GUIDs)
	}
	return out
}

// A run whose checkpoint at step 5 came after 7 batches (two updates skipped for non-finite
// gradients, each drawing a batch without advancing global_step) resumes with batch 8, the one
// an uninterrupted run trains on next, through the same path as the binary: the save through
// withInputPosition and the checkpoint manager, the manifest rank 0 shares, the skip.
func TestResumeContinuesTheDataAfterSkippedSteps(t *testing.T) {
	const batchSize, step, drawn, total = 3, 5, 7, 12
	dir := t.TempDir()
	data := filepath.Join(dir, "train.tf_record")
	writeRecords(t, data, 23) // not a multiple of the batch: batches straddle the epochs
	opts := tfrecord.DatasetOptions{ShuffleBuffer: 8, Seed: 42, Repeat: true}
	open := func() *tfrecord.Dataset {
		ds, err := tfrecord.OpenDataset([]string{data}, opts)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { ds.Close() })
		return ds
	}
	uninterrupted := batchGUIDs(t, open(), batchSize, total)

	hvd, err := horovod.Init()
	if err != nil {
		t.Fatal(err)
	}
	defer hvd.Shutdown()
	fakeModel := func(prefix string) error {
		if err := os.WriteFile(prefix+".data-00000-of-00001", []byte("weights"), 0o644); err != nil {
			return err
		}
		return os.WriteFile(prefix+".index", []byte("index"), 0o644)
	}
	resumeAt := func(t *testing.T, ckpts string) resumePoint {
		t.Helper()
		m, err := checkpoint.Open(ckpts, 5, 0)
		if err != nil {
			t.Fatal(err)
		}
		prefix, _, ok, err := m.Latest()
		if err != nil || !ok {
			t.Fatalf("Latest: ok=%v err=%v", ok, err)
		}
		rp, err := shareCheckpoint(hvd, prefix, t.TempDir(), batchSize)
		if err != nil {
			t.Fatal(err)
		}
		return rp
	}
	continued := func(t *testing.T, rp resumePoint) [][]string {
		t.Helper()
		ds := open()
		if err := ds.Skip(rp.examples(batchSize)); err != nil {
			t.Fatal(err)
		}
		return batchGUIDs(t, ds, batchSize, total-int(rp.Batches))
	}
	// at is the position of a run of batchSize that drew batches on ranks ranks.
	at := func(batches int64, ranks int) inputPosition {
		return inputPosition{Batches: batches, Examples: batches * batchSize, BatchSize: batchSize, Ranks: ranks}
	}
	// saveStep saves global step `step` through save into a new checkpoint directory.
	saveStep := func(t *testing.T, save checkpoint.SaveFunc) (ckpts, prefix string) {
		t.Helper()
		ckpts = t.TempDir()
		m, err := checkpoint.Open(ckpts, 5, 0)
		if err != nil {
			t.Fatal(err)
		}
		if prefix, err = m.Save(step, save); err != nil {
			t.Fatal(err)
		}
		return ckpts, prefix
	}

	t.Run("with the position file", func(t *testing.T) {
		ckpts, _ := saveStep(t, withInputPosition(fakeModel, at(drawn, 1)))
		rp := resumeAt(t, ckpts)
		if rp.Step != step || rp.Batches != drawn {
			t.Fatalf("resume point step %d, %d batches drawn; want %d, %d", rp.Step, rp.Batches, step, drawn)
		}
		if got, want := continued(t, rp), uninterrupted[drawn:]; !reflect.DeepEqual(got, want) {
			t.Errorf("the resumed run trains on\n%v\nthe uninterrupted one on\n%v", got, want)
		}
		if w := sizeChangeWarning(rp.Prefix, rp.inputPosition, 1, rp.examples(batchSize)) + batchChangeWarning(rp.Prefix, rp.inputPosition, batchSize, 1); w != "" {
			t.Errorf("resuming at the same size warns: %s", w)
		}
	})
	t.Run("saved by another number of ranks: resumes with a warning", func(t *testing.T) {
		ckpts, p := saveStep(t, withInputPosition(fakeModel, at(drawn, 4)))
		rp := resumeAt(t, ckpts)
		if rp.Step != step || rp.Batches != drawn || rp.Ranks != 4 {
			t.Fatalf("resume point %+v; want step %d, %d batches of 4 ranks", rp, step, drawn)
		}
		w := sizeChangeWarning(rp.Prefix, rp.inputPosition, 1, rp.examples(batchSize))
		for _, want := range []string{p + " was saved by a run of 4 rank(s), this one has 1", "peak learning rate", "skips 21 examples of its new shard"} {
			if !strings.Contains(w, want) {
				t.Errorf("warning %q does not say %q", w, want)
			}
		}
	})
	t.Run("without it: one batch per step", func(t *testing.T) {
		ckpts, _ := saveStep(t, fakeModel)
		rp := resumeAt(t, ckpts)
		if rp.Step != step || rp.Batches != step {
			t.Fatalf("resume point step %d, %d batches drawn; want %d, %d", rp.Step, rp.Batches, step, step)
		}
		if got, want := continued(t, rp), uninterrupted[step:]; !reflect.DeepEqual(got, want) {
			t.Errorf("the resumed run trains on\n%v\nthe uninterrupted one on\n%v", got, want)
		}
		if rp.Ranks != 0 || sizeChangeWarning(rp.Prefix, rp.inputPosition, 3, 0)+batchChangeWarning(rp.Prefix, rp.inputPosition, 5, 2) != "" {
			t.Errorf("an unknown size: %+v", rp)
		}
	})
	t.Run("a position file from before the rank count resumes", func(t *testing.T) {
		ckpts, p := saveStep(t, fakeModel)
		if err := os.WriteFile(p+positionSuffix, []byte(`{"batches": 7}`), 0o644); err != nil {
			t.Fatal(err)
		}
		rp := resumeAt(t, ckpts)
		if rp.Batches != drawn || rp.Ranks != 0 || rp.examples(batchSize) != drawn*batchSize || sizeChangeWarning(rp.Prefix, rp.inputPosition, 2, 0) != "" {
			t.Errorf("resume point %+v", rp)
		}
	})
	// Steps 6 and 7 skipped after the save at step 5, then a stop: the final save finds the
	// step saved and brings its position up to the batches drawn, as the loop calls it.
	t.Run("updates skipped after the latest save move its position", func(t *testing.T) {
		ckpts, _ := saveStep(t, withInputPosition(fakeModel, at(step, 1)))
		m, err := checkpoint.Open(ckpts, 5, 0)
		if err != nil {
			t.Fatal(err)
		}
		tr := &Trainer{ckpts: m, size: 1, opts: Options{Logf: t.Logf, BatchSize: batchSize}}
		if err := tr.saveCheckpoint(step, inputPosition{Batches: drawn, Examples: drawn * batchSize}); err != nil {
			t.Fatal(err)
		}
		rp := resumeAt(t, ckpts)
		if rp.Step != step || rp.Batches != drawn || rp.Ranks != 1 {
			t.Fatalf("resume point %+v; want step %d, %d batches of 1 rank", rp, step, drawn)
		}
		if got, want := continued(t, rp), uninterrupted[drawn:]; !reflect.DeepEqual(got, want) {
			t.Errorf("the resumed run trains on\n%v\nthe uninterrupted one on\n%v", got, want)
		}
	})
	// A run of batch size 1 saved after 7 batches (7 examples); the resumed run of batch size 3
	// goes on with example 8, not with example 22 (7 of its own batches), and says the size
	// changed.
	t.Run("saved at another batch size: the data continues after its examples", func(t *testing.T) {
		ckpts, p := saveStep(t, withInputPosition(fakeModel, inputPosition{Batches: drawn, Examples: drawn, BatchSize: 1, Ranks: 1}))
		rp := resumeAt(t, ckpts)
		ds := open()
		if err := ds.Skip(rp.examples(batchSize)); err != nil {
			t.Fatal(err)
		}
		want := slices.Collect(slices.Chunk(slices.Concat(batchGUIDs(t, open(), 1, drawn+3*batchSize)...)[drawn:], batchSize))
		if got := batchGUIDs(t, ds, batchSize, 3); !reflect.DeepEqual(got, want) {
			t.Errorf("the resumed run trains on\n%v\nthe examples after the 7 drawn are\n%v", got, want)
		}
		w := batchChangeWarning(rp.Prefix, rp.inputPosition, batchSize, 1)
		if want := p + " was saved by a run of batch size 1 per rank, this one has 3"; !strings.Contains(w, want) || !strings.Contains(w, "after the 7 examples it drew") {
			t.Errorf("warning %q", w)
		}
	})
	// The same batch size, other accumulation: the step's batch changed, and the warning says
	// how; a file from before accumulation was recorded (0) is a run of 1.
	t.Run("saved with other accumulation: a warning naming both", func(t *testing.T) {
		ckpts, p := saveStep(t, withInputPosition(fakeModel, inputPosition{Batches: 2 * step, Examples: 2 * step * batchSize, BatchSize: batchSize, AccumulationSteps: 2, Ranks: 1}))
		rp := resumeAt(t, ckpts)
		if rp.AccumulationSteps != 2 || rp.examples(batchSize) != 2*step*batchSize {
			t.Fatalf("resume point %+v", rp)
		}
		w := batchChangeWarning(rp.Prefix, rp.inputPosition, batchSize, 1)
		if want := fmt.Sprintf("%s was saved by a run of batch size %d x 2 accumulated per rank, this one has %d:", p, batchSize, batchSize); !strings.Contains(w, want) {
			t.Errorf("warning %q does not say %q", w, want)
		}
		if w := batchChangeWarning(rp.Prefix, rp.inputPosition, batchSize, 2); w != "" {
			t.Errorf("the same accumulation warns: %s", w)
		}
		if w := batchChangeWarning(rp.Prefix, inputPosition{Batches: step, BatchSize: batchSize}, batchSize, 1); w != "" {
			t.Errorf("a file without accumulation, resumed without it, warns: %s", w)
		}
	})
	t.Run("a damaged position file is an error naming it", func(t *testing.T) {
		_, p := saveStep(t, withInputPosition(fakeModel, at(drawn, 1)))
		if err := os.WriteFile(p+positionSuffix, []byte(`{"batches": 3}`), 0o644); err != nil {
			t.Fatal(err)
		}
		if _, err := manifestOf(p, batchSize); err == nil || !strings.Contains(err.Error(), p+positionSuffix) {
			t.Fatalf("a position behind the step: %v", err)
		}
		// Batches that, reckoned at the batch size, count more examples than an int64 holds:
		// wrapped around to a negative count, they skipped nothing.
		if err := os.WriteFile(p+positionSuffix, []byte(`{"batches": 4000000000000000000}`), 0o644); err != nil {
			t.Fatal(err)
		}
		if _, err := manifestOf(p, batchSize); err == nil || !strings.Contains(err.Error(), p+positionSuffix+" says 4000000000000000000 batches were drawn") {
			t.Fatalf("a position past int64's examples: %v", err)
		}
	})
}
