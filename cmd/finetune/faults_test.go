package main

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/gorovod/gorovod/tf"
)

// A run whose latest checkpoint has a truncated data file resumes from the newest sound one,
// with a warning naming the damaged file, and trains the steps since again.
func TestResumePassesOverATruncatedCheckpoint(t *testing.T) {
	model := tinyModel(t, false)
	data, out := t.TempDir(), filepath.Join(t.TempDir(), "out")
	writeData(t, data, 16, 4, 4)
	flags := tinyFlags(model, data, out, "--do_train", "--train_batch_size=4", "--num_train_epochs=2", "--save_checkpoints_steps=2")
	mustSucceed(t, exec.Command(finetuneBinary(t), flags...))
	last := latestStep(t, out)
	damaged := filepath.Join(out, fmt.Sprintf("model.ckpt-%d.data-00000-of-00001", last))
	st, err := os.Stat(damaged)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.Truncate(damaged, st.Size()/2); err != nil {
		t.Fatal(err)
	}
	output := mustSucceed(t, exec.Command(finetuneBinary(t), flags...))
	for _, want := range []string{
		damaged + " is damaged",
		fmt.Sprintf("falling back to model.ckpt-%d", last-2),
		fmt.Sprintf("step %d/%d", last, last),
	} {
		if !strings.Contains(output, want) {
			t.Errorf("the resume's output lacks %q:\n%s", want, output)
		}
	}
	// The steps since were trained again and the final checkpoint written anew, whole.
	if got := latestStep(t, out); got != last {
		t.Errorf("latest step after the resume: %d, want %d", got, last)
	}
	if err := tf.VerifyCheckpoint(filepath.Join(out, fmt.Sprintf("model.ckpt-%d", last))); err != nil {
		t.Error(err)
	}
}
