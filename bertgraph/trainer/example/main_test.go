package main

import (
	"bytes"
	"path/filepath"
	"strings"
	"testing"

	"github.com/gorovod/gorovod/bertgraph/trainer/internal/synthetic"
	"github.com/gorovod/gorovod/tf/checkpoint"
	"github.com/gorovod/gorovod/tf/testenv"
)

// The example trains the tiny model over 40 examples (5 steps of 8) and leaves the checkpoint of
// its last step; a second run finds it and has nothing left to train.
func TestExampleTrainsAndResumes(t *testing.T) {
	model := testenv.TinyModel.Require(t)
	dir := t.TempDir()
	train, out := filepath.Join(dir, "train.tf_record"), filepath.Join(dir, "out")
	if err := synthetic.WriteExamples(train, 40, 32, 128, 2); err != nil {
		t.Fatal(err)
	}
	args := []string{"-saved_model", model, "-train", train, "-output_dir", out}
	for _, want := range []string{"trained from step 0 to step 5 of 5", "trained from step 5 to step 5 of 5"} {
		var log bytes.Buffer
		if err := run(args, &log); err != nil {
			t.Fatalf("%v\n%s", err, log.String())
		}
		if !strings.Contains(log.String(), want) {
			t.Errorf("log does not say %q:\n%s", want, log.String())
		}
	}
	if _, step, ok, err := checkpoint.Latest(out); !ok || step != 5 || err != nil {
		t.Errorf("latest checkpoint: step %d, ok %v, %v", step, ok, err)
	}
}
