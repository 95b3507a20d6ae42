package main

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

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

// A second job into the --output_dir of a running one refuses to start on every rank, naming
// the directory and the job that holds it, and leaves the first job alone; once the first job
// is killed with SIGKILL, a new run uses the directory with no manual step.
func TestSecondRunIntoAnOutputDirIsRefused(t *testing.T) {
	model := tinyModel(t, false)
	data, out := t.TempDir(), filepath.Join(t.TempDir(), "out")
	writeData(t, data, 240, 4, 4)
	flags := tinyFlags(model, data, out, "--do_train", "--train_batch_size=4", "--num_train_epochs=100", "--save_checkpoints_steps=5")
	first := mpirun(t, 2, flags...)
	log, pids := startUntilCheckpoint(t, first, out, 5)

	second := runCmd(t, mpirun(t, 2, append(flags, "--seed=99")...))
	t.Logf("the second job ended in %v", second.took.Round(time.Millisecond))
	want := fmt.Sprintf("--output_dir: %s is in use by another run: finetune, pid %d on ", out, pids[0])
	if second.code == 0 || !strings.Contains(second.output, want) || strings.Contains(second.output, "Running training") {
		t.Errorf("second job: exit %d, output lacks %q or trained:\n%s", second.code, want, second.output)
	}
	if err := first.Process.Signal(syscall.Signal(0)); err != nil {
		t.Fatalf("the first job ended when the second started: %v\n%s", err, log.String())
	}

	if err := syscall.Kill(pids[0], syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	waitExit(t, first, time.Now(), 60*time.Second)
	evalOnly := tinyFlags(model, data, out, "--do_eval")
	if output := mustSucceed(t, exec.Command(finetuneBinary(t), evalOnly...)); !strings.Contains(output, "eval_accuracy") {
		t.Errorf("evaluation in the directory of the killed job:\n%s", output)
	}
}
