package main

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
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

// gorovodrunBinary builds cmd/gorovodrun once, beside this command's binary.
func gorovodrunBinary(t *testing.T) string {
	t.Helper()
	gorovodrunOnce.Do(func() {
		gorovodrunPath = filepath.Join(shared, "gorovodrun")
		if out, err := exec.Command("go", "build", "-o", gorovodrunPath, "../gorovodrun").CombinedOutput(); err != nil {
			gorovodrunErr = fmt.Errorf("go build ../gorovodrun: %v\n%s", err, out)
		}
	})
	if gorovodrunErr != nil {
		t.Fatal(gorovodrunErr)
	}
	return gorovodrunPath
}

var (
	gorovodrunOnce sync.Once
	gorovodrunPath string
	gorovodrunErr  error
)

// underGorovodrun returns the command that runs finetune on 2 ranks through gorovodrun.
func underGorovodrun(t *testing.T, args ...string) *exec.Cmd {
	cmd := exec.Command(gorovodrunBinary(t), append([]string{"--oversubscribe", "-np", "2", finetuneBinary(t)}, args...)...)
	cmd.Env = append(os.Environ(), "OMPI_ALLOW_RUN_AS_ROOT=1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1", "TF_CPP_MIN_LOG_LEVEL=2", "CUDA_VISIBLE_DEVICES=")
	return cmd
}

// childOf returns the child process of pid (gorovodrun's mpirun).
func childOf(t *testing.T, pid int) int {
	t.Helper()
	tasks, _ := filepath.Glob(fmt.Sprintf("/proc/%d/task/*/children", pid))
	for _, f := range tasks {
		b, _ := os.ReadFile(f)
		if fields := strings.Fields(string(b)); len(fields) > 0 {
			child, _ := strconv.Atoi(fields[0])
			return child
		}
	}
	t.Fatalf("process %d has no child", pid)
	return 0
}

// Under gorovodrun, a job that fails before training, or whose rank dies mid-training, ends
// within seconds (Open MPI waited two sigkill timeouts of 10 s with the launch lines that
// gave rank 0 time to checkpoint on Ctrl-C), and Ctrl-C still makes rank 0 write the checkpoint
// of the step every rank stopped after. The bounds leave room for a loaded machine;
// scripts/faults/fault-times.sh measures the figures.
func TestGorovodrunEndsFailedJobsPromptlyAndCheckpointsOnCtrlC(t *testing.T) {
	model := tinyModel(t, false)
	data := t.TempDir()
	writeData(t, data, 240, 4, 4)
	const failedBound = 15 * time.Second

	failed := runCmd(t, underGorovodrun(t, tinyFlags(model, t.TempDir(), filepath.Join(t.TempDir(), "out"), "--do_train")...))
	t.Logf("a setup error: the job took %v from start to end", failed.took.Round(time.Millisecond))
	if failed.code == 0 || !strings.Contains(failed.output, "finetune[rank 0]: error: --data_dir") || failed.took > failedBound {
		t.Errorf("a setup error: exit %d after %v (bound %v), or rank 0's error missing:\n%s", failed.code, failed.took, failedBound, failed.output)
	}

	flags := tinyFlags(model, data, filepath.Join(t.TempDir(), "out"), "--do_train", "--train_batch_size=4", "--num_train_epochs=100", "--save_checkpoints_steps=5")
	killed := underGorovodrun(t, flags...)
	log := startUntilOutput(t, killed, "saved checkpoint")
	pids := rankPIDs(t, childOf(t, killed.Process.Pid))
	if err := syscall.Kill(pids[1], syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	code, took := waitExit(t, killed, time.Now(), 60*time.Second)
	t.Logf("kill -9 of rank 1: the job ended %v later, exit %d", took.Round(time.Millisecond), code)
	if code == 0 || took > failedBound {
		t.Errorf("kill -9 of rank 1: exit %d after %v (bound %v):\n%s", code, took, failedBound, log.String())
	}

	out := filepath.Join(t.TempDir(), "out")
	interrupted := underGorovodrun(t, tinyFlags(model, data, out, "--do_train", "--train_batch_size=4", "--num_train_epochs=100", "--save_checkpoints_steps=20")...)
	log = startUntilOutput(t, interrupted, "saved checkpoint")
	if err := interrupted.Process.Signal(os.Interrupt); err != nil {
		t.Fatal(err)
	}
	code, took = waitExit(t, interrupted, time.Now(), 60*time.Second)
	t.Logf("Ctrl-C: the job ended %v later, exit %d", took.Round(time.Millisecond), code)
	stopped := latestStep(t, out)
	if code != 130 || !strings.Contains(log.String(), "finetune[rank 0]: interrupt: exiting after the checkpoint") ||
		!strings.Contains(log.String(), fmt.Sprintf("saved checkpoint %s", filepath.Join(out, fmt.Sprintf("model.ckpt-%d", stopped)))) {
		t.Errorf("Ctrl-C: exit %d (want 130), or no checkpoint of the step the ranks stopped after (latest %d):\n%s", code, stopped, log.String())
	}
}

// Machines without a shared disk each read their own copy of train.tsv: a rank whose copy
// differs from rank 0's (a stale one, 12 lines of 16) stops every rank before training, naming
// it, where line i of its copy would have gone on as line i of rank 0's, its missing lines
// silently untrained.
func TestRanksReadingAnotherTrainFileFail(t *testing.T) {
	model := tinyModel(t, false)
	data, stale, out := t.TempDir(), t.TempDir(), filepath.Join(t.TempDir(), "out")
	writeData(t, data, 16, 4, 4)
	writeData(t, stale, 12, 4, 4)
	failsBeforeTraining(t, tinyFlags(model, data, out, "--do_train", "--train_batch_size=2"),
		tinyFlags(model, stale, out, "--do_train", "--train_batch_size=2"),
		"error: rank(s) 1 read another training file than rank 0")
}

// failsBeforeTraining launches a job of 2 ranks, each with flags of its own (mpirun's program
// list: rank 0's, then rank 1's), and checks that it fails with want before training.
func failsBeforeTraining(t *testing.T, rank0, rank1 []string, want string) {
	t.Helper()
	r := runCmd(t, mpmd(t, rank0, rank1))
	if r.code == 0 || !strings.Contains(r.output, want) || strings.Contains(r.output, "Running training") {
		t.Errorf("exit %d, output lacks %q or trained:\n%s", r.code, want, r.output)
	}
}

// mpmd returns the command that runs a 2-rank job of finetune, each rank with its own flags.
func mpmd(t *testing.T, rank0, rank1 []string) *exec.Cmd {
	t.Helper()
	args := append([]string{"--oversubscribe", "--bind-to", "none", "-np", "1", finetuneBinary(t)}, rank0...)
	args = append(append(args, ":", "-np", "1", finetuneBinary(t)), rank1...)
	cmd := exec.Command("mpirun", args...)
	cmd.Env = append(os.Environ(), "OMPI_ALLOW_RUN_AS_ROOT=1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1", "TF_CPP_MIN_LOG_LEVEL=2", "CUDA_VISIBLE_DEVICES=")
	return cmd
}

// Ranks whose --amp resolved to different precisions (here named apart, as --amp=true does on
// machines with and without a GPU) stop before training, every rank naming each one's: a float16
// rank's gradients carry its loss scale through the allreduce, and the ranks would apply
// different updates (measured on the tiny model before this check: rank 0 float16 and rank 1
// float32 ended 4 steps 0.01 apart in their weights).
func TestRanksInDifferentPrecisionsFail(t *testing.T) {
	model := tinyModel(t, false)
	data, out := t.TempDir(), filepath.Join(t.TempDir(), "out")
	writeData(t, data, 16, 4, 4)
	failsBeforeTraining(t, tinyFlags(model, data, out, "--do_train", "--train_batch_size=2", "--amp=fp16"),
		tinyFlags(model, data, out, "--do_train", "--train_batch_size=2", "--amp=false"),
		"error: the ranks compute in different precisions (rank 0 float16, rank 1 float32)")
}

// Ranks given other training flags than rank 0 (mpirun's program list, a wrapper per machine)
// stop before training, every rank naming the flags and its own values: rank 1 with twice the
// epochs trained another learning-rate schedule, failed with "horovod: shut down (Shutdown
// called on rank 0)" once rank 0 was done, and mpirun then ended rank 0 before its export.
func TestRanksGivenOtherTrainingFlagsFail(t *testing.T) {
	model := tinyModel(t, false)
	data, out := t.TempDir(), filepath.Join(t.TempDir(), "out")
	writeData(t, data, 16, 4, 4)
	failsBeforeTraining(t, tinyFlags(model, data, out, "--do_train", "--do_eval", "--train_batch_size=2", "--num_train_epochs=1"),
		tinyFlags(model, data, out, "--do_train", "--do_eval", "--train_batch_size=2", "--num_train_epochs=2"),
		`error: rank(s) 1 were given other settings than rank 0: --num_train_epochs (this rank's "2")`)
	// A rank that trains beside one that does not is named for that alone.
	failsBeforeTraining(t, tinyFlags(model, data, out, "--do_train", "--do_eval", "--train_batch_size=2"),
		tinyFlags(model, data, out, "--do_eval", "--train_batch_size=4"),
		`error: rank(s) 1 were given other settings than rank 0: --do_train (this rank's "false"): give every rank the same`)
	// Without training, rank 0 alone evaluates: the training flags need not agree.
	mustSucceed(t, mpmd(t, tinyFlags(model, data, out, "--do_eval", "--num_train_epochs=1"),
		tinyFlags(model, data, out, "--do_eval", "--num_train_epochs=2")))
}

// A damaged record in rank 1's train.tf_record (a bit flipped on disk or in a copy keeps the
// size its key checks) fails the job naming the file, and the next run converts rank 1's
// features again, where every later run failed on the same record, nothing saying that the
// file is derived from train.tsv.
func TestDamagedTrainingFeaturesAreConvertedAgain(t *testing.T) {
	model := tinyModel(t, false)
	data, out := t.TempDir(), filepath.Join(t.TempDir(), "out")
	writeData(t, data, 32, 4, 4)
	flags := tinyFlags(model, data, out, "--do_train", "--train_batch_size=4", "--num_train_epochs=1", "--export_dir=none")
	mustSucceed(t, mpirun(t, 2, flags...))
	cache := filepath.Join(out, "1", "train.tf_record")
	b, err := os.ReadFile(cache)
	if err != nil {
		t.Fatal(err)
	}
	b[len(b)-5] ^= 0xff // the last record's last byte of data, before its checksum
	if err := os.WriteFile(cache, b, 0o644); err != nil {
		t.Fatal(err)
	}
	more := append(flags, "--num_train_epochs=2") // resumed: reads the features again
	r := runCmd(t, mpirun(t, 2, more...))
	for _, want := range []string{"finetune[rank 1]: error: tfrecord: " + cache + ": record at byte offset", cache + " holds this rank's features of"} {
		if r.code == 0 || !strings.Contains(r.output, want) {
			t.Errorf("a damaged record: exit %d, output lacks %q:\n%s", r.code, want, r.output)
		}
	}
	if output := mustSucceed(t, mpirun(t, 2, more...)); !strings.Contains(output, "(converted "+cache+")") {
		t.Errorf("the run after did not convert rank 1's features again:\n%s", output)
	}
}

// A rank that cannot restore the checkpoint it received from rank 0 removes its copy as it
// fails: the copy is as large as the model and its Adam slots, and only a later successful
// resume removed it. Renamed one step back, the checkpoint holds another global_step than its name
// says, which every rank's restore refuses.
func TestFailedResumeLeavesNoReceivedCopy(t *testing.T) {
	_, _, flags, out, last := trainedTinyRun(t)
	from, to := fmt.Sprintf("model.ckpt-%d", last), fmt.Sprintf("model.ckpt-%d", last-1)
	files, _ := filepath.Glob(filepath.Join(out, from+".*"))
	for _, f := range files {
		if err := os.Rename(f, filepath.Join(out, to+strings.TrimPrefix(filepath.Base(f), from))); err != nil {
			t.Fatal(err)
		}
	}
	state := filepath.Join(out, "checkpoint")
	b, err := os.ReadFile(state)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(state, []byte(strings.ReplaceAll(string(b), `"`+from+`"`, `"`+to+`"`)), 0o644); err != nil {
		t.Fatal(err)
	}

	r := runCmd(t, mpirun(t, 2, flags...))
	want := fmt.Sprintf("holds global_step %d, its name says %d", last, last-1)
	if r.code == 0 || !strings.Contains(r.output, want) {
		t.Fatalf("exit %d, output lacks %q:\n%s", r.code, want, r.output)
	}
	if _, err := os.Stat(filepath.Join(out, "1", "resume")); !os.IsNotExist(err) {
		t.Errorf("rank 1's received copy is left after its failed restore (stat: %v)", err)
	}
}
