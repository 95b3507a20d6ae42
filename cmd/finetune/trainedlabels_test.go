package main

import (
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// A run that trains from no checkpoint records its labels; a later run over its checkpoints
// with the labels in another order is refused before it evaluates, predicts or trains, and one
// with the same labels goes on. A checkpoint older than the record is not checked.
func TestTrainedLabelsRecord(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, trainedLabelsFile)
	if err := checkTrainedLabels(dir, []string{"neg", "pos"}, false, false); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(path); !os.IsNotExist(err) {
		t.Fatalf("recorded without training: %v", err)
	}
	if err := checkTrainedLabels(dir, []string{"neg", "pos"}, false, true); err != nil {
		t.Fatal(err)
	}
	var rec trainedLabels
	if b, err := os.ReadFile(path); err != nil || json.Unmarshal(b, &rec) != nil || !slices.Equal(rec.Labels, []string{"neg", "pos"}) {
		t.Fatalf("record %+v, %v", rec, err)
	}
	for _, training := range []bool{false, true} {
		if err := checkTrainedLabels(dir, []string{"neg", "pos"}, true, training); err != nil {
			t.Errorf("same labels, training %v: %v", training, err)
		}
		err := checkTrainedLabels(dir, []string{"pos", "neg"}, true, training)
		if err == nil || !strings.Contains(err.Error(), "trained with the labels neg,pos") || !strings.Contains(err.Error(), "--labels=neg,pos") {
			t.Errorf("swapped labels, training %v: %v", training, err)
		}
	}
	// Training again from no checkpoint (a failed first run) records the new labels.
	if err := checkTrainedLabels(dir, []string{"a", "b"}, false, true); err != nil {
		t.Fatal(err)
	}
	old := t.TempDir()
	if err := checkTrainedLabels(old, []string{"x", "y"}, true, true); err != nil {
		t.Errorf("a checkpoint without a record: %v", err)
	}
}

// End to end: evaluating a trained output_dir with --labels swapped fails naming the labels.
func TestSwappedLabelsAreRefused(t *testing.T) {
	model := tinyModel(t, false)
	data, out := t.TempDir(), t.TempDir()
	writeData(t, data, 16, 8, 0)
	mustSucceed(t, exec.Command(finetuneBinary(t), tinyFlags(model, data, out, "--do_train", "--train_batch_size=8", "--num_train_epochs=1", "--export_dir=none")...))
	r := runCmd(t, exec.Command(finetuneBinary(t), tinyFlags(model, data, out, "--do_eval", "--labels=1,0")...))
	if r.code == 0 || !strings.Contains(r.output, "were trained with the labels 0,1") {
		t.Errorf("--labels=1,0 over a run trained with 0,1: exit %d\n%s", r.code, r.output)
	}
	if _, err := os.Stat(filepath.Join(out, "eval_results.txt")); !os.IsNotExist(err) {
		t.Errorf("eval_results.txt written: %v", err)
	}
	mustSucceed(t, exec.Command(finetuneBinary(t), tinyFlags(model, data, out, "--do_eval", "--labels=0,1")...))
}
