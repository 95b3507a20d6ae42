package main

import (
	"bufio"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/gorovod/gorovod/tf/checkpoint"
	"github.com/gorovod/gorovod/tf/testenv"
)

// rankPIDs finds the finetune processes mpirun started, by rank (OMPI_COMM_WORLD_RANK).
func rankPIDs(t *testing.T, mpirunPID int) map[int]int {
	t.Helper()
	out := map[int]int{}
	procs, _ := filepath.Glob("/proc/[0-9]*/stat")
	for _, p := range procs {
		b, err := os.ReadFile(p)
		if err != nil {
			continue
		}
		// pid (comm) state ppid ...
		s := string(b)
		close := strings.LastIndexByte(s, ')')
		if close < 0 || !strings.Contains(s[:close], "(finetune") {
			continue
		}
		fields := strings.Fields(s[close+1:])
		if len(fields) < 2 || fields[1] != strconv.Itoa(mpirunPID) {
			continue
		}
		pid, _ := strconv.Atoi(strings.Fields(s)[0])
		env, _ := os.ReadFile(filepath.Join(filepath.Dir(p), "environ"))
		for _, kv := range strings.Split(string(env), "\x00") {
			if v, ok := strings.CutPrefix(kv, "OMPI_COMM_WORLD_RANK="); ok {
				r, _ := strconv.Atoi(v)
				out[r] = pid
			}
		}
	}
	return out
}

// startUntilCheckpoint starts cmd and returns once output_dir's state file names a checkpoint
// of at least step atLeast, with the ranks' process ids.
func startUntilCheckpoint(t *testing.T, cmd *exec.Cmd, outputDir string, atLeast int64) (*lockedBuffer, map[int]int) {
	t.Helper()
	out := &lockedBuffer{}
	// One writer for both: os/exec copies stdout and stderr from two goroutines.
	cmd.Stdout, cmd.Stderr = out, out
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(90 * time.Second)
	for time.Now().Before(deadline) {
		time.Sleep(50 * time.Millisecond)
		if _, step, ok, _ := checkpoint.Latest(outputDir); ok && step >= atLeast {
			pids := rankPIDs(t, cmd.Process.Pid)
			if len(pids) == 2 {
				return out, pids
			}
		}
	}
	cmd.Process.Kill()
	cmd.Wait()
	t.Fatalf("no checkpoint of step %d within 90s:\n%s", atLeast, out.String())
	return nil, nil
}

// lockedBuffer collects the output of a running command, written from os/exec's copying
// goroutines and read by the test.
type lockedBuffer struct {
	mu sync.Mutex
	b  strings.Builder
}

func (w *lockedBuffer) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.b.Write(p)
}

func (w *lockedBuffer) String() string {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.b.String()
}

func latestStep(t *testing.T, dir string) int64 {
	t.Helper()
	_, step, ok, err := checkpoint.Latest(dir)
	if err != nil || !ok {
		t.Fatalf("no checkpoint in %s: %v", dir, err)
	}
	return step
}

// waitExit waits for cmd and returns its exit code and how long it took after since.
func waitExit(t *testing.T, cmd *exec.Cmd, since time.Time, limit time.Duration) (int, time.Duration) {
	t.Helper()
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	select {
	case err := <-done:
		code := 0
		if ee, ok := err.(*exec.ExitError); ok {
			code = ee.ExitCode()
		} else if err != nil {
			t.Fatal(err)
		}
		return code, time.Since(since)
	case <-time.After(limit):
		cmd.Process.Kill()
		<-done
		t.Fatalf("mpirun still running %v after the event", limit)
		return 0, 0
	}
}

// Train on 2 ranks, kill one rank hard after a checkpoint, check the job dies with a message,
// resume, and check every output: the resumed step, eval_results.txt, test_results.tsv with one
// row per real example, checkpoints and events as TensorFlow reads them, and the exported
// serving model's predictions computed by Python TensorFlow against ours.
func TestTrainKillResumeEvalPredictExport(t *testing.T) {
	model := tinyModel(t, true)
	data, out := t.TempDir(), filepath.Join(t.TempDir(), "out")
	const trainLines, testLines = 240, 37
	writeData(t, data, trainLines, 30, testLines)
	flags := tinyFlags(model, data, out, "--do_train", "--train_batch_size=4", "--num_train_epochs=8",
		"--learning_rate=1e-3", "--save_checkpoints_steps=20", "--keep_checkpoint_max=3")
	const totalSteps = trainLines / 4 * 8 / 2

	first := mpirun(t, 2, flags...)
	log, pids := startUntilCheckpoint(t, first, out, 40)
	killed := time.Now()
	if err := syscall.Kill(pids[1], syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	code, took := waitExit(t, first, killed, 60*time.Second)
	if code == 0 || !regexp.MustCompile(`(?i)rank 1.*(signal 9|killed)|killed.*rank 1`).MatchString(log.String()) {
		t.Fatalf("after killing rank 1: exit %d, output lacks a message naming it:\n%s", code, log.String())
	}
	t.Logf("rank 1 killed: the job ended in %v with exit %d", took.Round(time.Millisecond), code)
	resumeAt := latestStep(t, out)
	if resumeAt >= totalSteps || resumeAt < 40 {
		t.Fatalf("latest checkpoint after the kill is step %d", resumeAt)
	}

	// Two inter-op threads: rank 0, alone after training, evaluates and predicts two batches
	// at a time with its one intra-op thread each (on a machine of two cores or more).
	second := mustSucceed(t, mpirun(t, 2, append(flags, "--do_eval", "--do_predict", "--predict_batch_size=8", "--eval_batch_size=4", "--inter_op_threads=2")...))
	if runtime.NumCPU() >= 2 {
		for _, phase := range []string{"Eval results", "Predict results"} {
			if !regexp.MustCompile(regexp.QuoteMeta(phase) + ` \*+ \([^)]*, 2 batches at a time, in `).MatchString(second) {
				t.Errorf("the %s line does not say 2 batches at a time:\n%s", phase, second)
			}
		}
	}
	if want := fmt.Sprintf("resuming from %s at step %d", filepath.Join(out, fmt.Sprintf("model.ckpt-%d", resumeAt)), resumeAt); !strings.Contains(second, want) {
		t.Fatalf("resumed run does not say %q:\n%s", want, second)
	}
	if !strings.Contains(second, "(reused "+filepath.Join(out, "train.tf_record")+")") {
		t.Errorf("the feature cache was not reused:\n%s", second)
	}
	if latestStep(t, out) != totalSteps {
		t.Fatalf("final checkpoint at step %d, want %d", latestStep(t, out), totalSteps)
	}

	// eval_results.txt: run_classifier's four keys, sorted, of the final step.
	evalText, err := os.ReadFile(filepath.Join(out, "eval_results.txt"))
	if err != nil {
		t.Fatal(err)
	}
	re := regexp.MustCompile(`^eval_accuracy = ([0-9.e-]+)\neval_loss = ([0-9.e-]+)\nglobal_step = (\d+)\nloss = ([0-9.e-]+)\n$`)
	m := re.FindStringSubmatch(string(evalText))
	if m == nil || m[3] != strconv.Itoa(totalSteps) {
		t.Fatalf("eval_results.txt:\n%s", evalText)
	}
	if acc, _ := strconv.ParseFloat(m[1], 64); acc < 0.9 {
		t.Errorf("eval_accuracy %v on a separable task", acc)
	}

	// test_results.tsv: one row of 2 probabilities per test line.
	ours := readTestResults(t, filepath.Join(out, "test_results.tsv"))
	if len(ours) != testLines {
		t.Fatalf("test_results.tsv has %d rows for %d examples", len(ours), testLines)
	}
	for i, row := range ours {
		if len(row) != 2 || math.Abs(row[0]+row[1]-1) > 1e-5 {
			t.Fatalf("row %d: %v", i, row)
		}
	}

	// TensorFlow's view of the checkpoints, the events and the exported model.
	var py struct {
		GlobalStep  int64       `json:"global_step"`
		Kept        []string    `json:"kept"`
		HasWeights  bool        `json:"has_weights"`
		EventSteps  [][]int64   `json:"event_steps"`
		Tags        []string    `json:"tags"`
		Predictions [][]float64 `json:"predictions"`
	}
	script := `
import json, os, sys
import numpy as np
import tensorflow as tf
out, data, model, seq, step = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4]), sys.argv[5]
r = tf.train.load_checkpoint(out)
names = r.get_variable_to_shape_map()
# Keyed as run_classifier's checkpoints: Google names, Adam slots beside them, global_step.
res = {"global_step": int(r.get_tensor("global_step")),
       "kept": [os.path.basename(p) for p in tf.train.get_checkpoint_state(out).all_model_checkpoint_paths],
       "has_weights": all(n in names for n in ("bert/embeddings/word_embeddings",
                                               "bert/embeddings/word_embeddings/adam_m",
                                               "bert/embeddings/word_embeddings/adam_v"))}
steps, tags = [], set()
for f in sorted(tf.io.gfile.glob(out + "/events.out.tfevents.*")):
    s = []
    for e in tf.compat.v1.train.summary_iterator(f):
        if e.summary.value:
            s.append(e.step)
            tags |= {v.tag for v in e.summary.value}
    steps.append(s)
res["event_steps"], res["tags"] = steps, sorted(tags)
# Features of the test file computed here: every word of this data is a vocabulary entry.
vocab = {w: i for i, w in enumerate(open(model + "/assets.extra/vocab.txt").read().split("\n"))}
ids, mask = [], []
for line in open(data + "/test.tsv"):
    words = line.rstrip("\n").split("\t", 1)[1].split()
    toks = [vocab["[CLS]"]] + [vocab[w] for w in words][: seq - 2] + [vocab["[SEP]"]]
    ids.append(toks + [0] * (seq - len(toks)))
    mask.append([1] * len(toks) + [0] * (seq - len(toks)))
served = tf.saved_model.load(out + "/export/" + step)
p = served.signatures["serving_default"](input_ids=tf.constant(ids, tf.int32), input_mask=tf.constant(mask, tf.int32),
                                         segment_ids=tf.zeros([len(ids), seq], tf.int32))["probabilities"]
res["predictions"] = p.numpy().astype(float).tolist()
print(json.dumps(res))
`
	if err := json.Unmarshal(testenv.Python(t, script, out, data, model, "32", strconv.Itoa(totalSteps)), &py); err != nil {
		t.Fatal(err)
	}
	if py.GlobalStep != totalSteps || !py.HasWeights || len(py.Kept) != 3 || py.Kept[2] != fmt.Sprintf("model.ckpt-%d", totalSteps) {
		t.Errorf("checkpoint as TensorFlow reads it: %+v", py)
	}
	if len(py.EventSteps) != 2 {
		t.Fatalf("%d event files, want one per run", len(py.EventSteps))
	}
	resumed := py.EventSteps[1]
	if len(resumed) != int(totalSteps-resumeAt) || resumed[0] != resumeAt+1 || resumed[len(resumed)-1] != totalSteps {
		t.Errorf("the resumed run's events cover steps %v..., want %d..%d", resumed[:min(3, len(resumed))], resumeAt+1, totalSteps)
	}
	if strings.Join(py.Tags, ",") != "examples_per_sec,global_norm,learning_rate,loss,train_accuracy" {
		t.Errorf("event tags %v", py.Tags)
	}
	for i := range ours {
		for k := range 2 {
			if d := math.Abs(py.Predictions[i][k] - ours[i][k]); d > 1e-5 {
				t.Fatalf("example %d: exported model gives %v in Python, test_results.tsv %v", i, py.Predictions[i], ours[i])
			}
		}
	}
}

func readTestResults(t *testing.T, path string) [][]float64 {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var rows [][]float64
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		var row []float64
		for _, s := range strings.Split(sc.Text(), "\t") {
			v, err := strconv.ParseFloat(s, 64)
			if err != nil {
				t.Fatalf("%s:%d: %v", path, len(rows)+1, err)
			}
			row = append(row, v)
		}
		rows = append(rows, row)
	}
	return rows
}

// SIGINT to one rank stops every rank after the same step: rank 0 writes the checkpoint of that
// step, and all of them exit on their own with 128+SIGINT, none killed, even when one rank is
// held up on its way out.
func TestSIGINTCheckpointsAndStopsEveryRank(t *testing.T) {
	model := tinyModel(t, true)
	data, out := t.TempDir(), filepath.Join(t.TempDir(), "out")
	writeData(t, data, 240, 4, 4)
	cmd := mpirun(t, 2, tinyFlags(model, data, out, "--do_train", "--do_eval", "--train_batch_size=4",
		"--num_train_epochs=100", "--save_checkpoints_steps=20")...)
	log, pids := startUntilCheckpoint(t, cmd, out, 20)
	sent := time.Now()
	if err := syscall.Kill(pids[1], syscall.SIGINT); err != nil {
		t.Fatal(err)
	}
	// Rank 1 is held up after training, as a busy machine can: rank 0 must not exit (and so have
	// mpirun end rank 1) before rank 1 has said it stops after the checkpoint.
	for deadline := time.Now().Add(60 * time.Second); !strings.Contains(log.String(), "trained steps"); {
		if time.Now().After(deadline) {
			cmd.Process.Kill()
			t.Fatalf("rank 0 did not end its training within 60s of the interrupt:\n%s", log.String())
		}
		time.Sleep(time.Millisecond)
	}
	switch err := syscall.Kill(pids[1], syscall.SIGSTOP); {
	case errors.Is(err, syscall.ESRCH):
		t.Log("rank 1 was out before it could be held up")
	case err != nil:
		t.Fatal(err)
	default:
		time.Sleep(time.Second)
		if err := syscall.Kill(pids[1], syscall.SIGCONT); err != nil {
			t.Fatal(err)
		}
	}
	code, took := waitExit(t, cmd, sent, 60*time.Second)
	output := log.String()
	t.Logf("SIGINT to rank 1: every rank out after %v, mpirun exit %d", took.Round(time.Millisecond), code)
	for r := range 2 {
		if !strings.Contains(output, fmt.Sprintf("finetune[rank %d]: interrupt: exiting after the checkpoint", r)) {
			t.Errorf("rank %d did not stop cleanly:\n%s", r, output)
		}
	}
	if strings.Contains(output, "signal 9") || strings.Contains(output, "eval_accuracy") || strings.Contains(output, "without a checkpoint") {
		t.Errorf("a rank was killed or said it left without a checkpoint, or evaluation ran after the interrupt:\n%s", output)
	}
	// The checkpoint is of the step every rank stopped after: the last one rank 0 reported.
	stopped := latestStep(t, out)
	reported := regexp.MustCompile(`(?m)^step (\d+)/\d+:`).FindAllStringSubmatch(output, -1)
	if len(reported) == 0 || reported[len(reported)-1][1] != strconv.FormatInt(stopped, 10) || stopped <= 20 ||
		!strings.Contains(output, fmt.Sprintf("saved checkpoint %s", filepath.Join(out, fmt.Sprintf("model.ckpt-%d", stopped)))) {
		t.Errorf("the interrupt's checkpoint is step %d, not the last step trained:\n%s", stopped, output)
	}
}

// Bad setups fail before any training, with a message that names the problem.
func TestBadSetupsFailBeforeTraining(t *testing.T) {
	model := tinyModel(t, true)
	data := t.TempDir()
	writeData(t, data, 16, 4, 4)
	notDir := filepath.Join(t.TempDir(), "file")
	os.WriteFile(notDir, nil, 0o644)
	bigVocab := filepath.Join(t.TempDir(), "vocab.txt")
	var words []string
	for i := range 200 {
		words = append(words, fmt.Sprintf("w%d", i))
	}
	os.WriteFile(bigVocab, []byte("[PAD]\n[UNK]\n[CLS]\n[SEP]\n"+strings.Join(words, "\n")+"\n"), 0o644)
	for _, c := range []struct {
		name  string
		flags []string
		code  int
		want  string
	}{
		{"unknown flag", []string{"--bogus=1"}, 2, "flag provided but not defined: -bogus"},
		{"missing data", []string{"--data_dir=" + t.TempDir()}, 1, "train.tsv: no such file or directory"},
		{"vocab larger than the model", []string{"--vocab_file=" + bigVocab}, 1, "has 204 tokens but the model embeds only vocab_size 128"},
		{"sequence other than exported", []string{"--max_seq_length=16"}, 2, "--max_seq_length 16, but --saved_model " + model + " was exported for 32"},
		{"casing other than exported", []string{"--do_lower_case=false"}, 2, "was exported with do_lower_case=true"},
		{"task with other labels", []string{"--task_name=mnli"}, 2, "--task_name=mnli has 3 labels"},
		{"unwritable output", []string{"--output_dir=" + filepath.Join(notDir, "out")}, 1, "--output_dir: mkdir"},
		{"export path through a file", []string{"--export_dir=" + filepath.Join(notDir, "export")}, 1, "--export_dir: stat " + filepath.Join(notDir, "export") + ": not a directory"},
		{"export path a file", []string{"--export_dir=" + notDir}, 1, "--export_dir: " + notDir + " is not a directory"},
		{"labels of another task", []string{"--labels=a,b,c"}, 1, "names 3 labels, but --saved_model"},
		{"NCCL without CUDA", []string{"--allreduce_backend=nccl"}, 1, "libcudart"},
	} {
		t.Run(c.name, func(t *testing.T) {
			args := append(tinyFlags(model, data, filepath.Join(t.TempDir(), "out"), "--do_train"), c.flags...)
			r := runCmd(t, exec.Command(finetuneBinary(t), args...))
			if r.code != c.code || !strings.Contains(r.output, c.want) || strings.Contains(r.output, "Running training") {
				t.Errorf("exit %d (want %d), output lacks %q or trained:\n%s", r.code, c.code, c.want, r.output)
			}
		})
	}
	// Only rank 1 cannot write its directory: both ranks stop, rank 0 saying why.
	out := t.TempDir()
	os.WriteFile(filepath.Join(out, "1"), nil, 0o644)
	r := runCmd(t, mpirun(t, 2, tinyFlags(model, data, out, "--do_train")...))
	if r.code == 0 || !strings.Contains(r.output, "rank(s) 1 could not start") ||
		!strings.Contains(r.output, "finetune[rank 1]: error: --output_dir") || strings.Contains(r.output, "Running training") {
		t.Errorf("rank 1 without an output directory: exit %d\n%s", r.code, r.output)
	}
	// A directory where rank 0 writes eval_results.txt: every rank stops before training, where
	// the rename that writes the file failed after training and evaluating.
	out = t.TempDir()
	os.Mkdir(filepath.Join(out, evalResultsFile), 0o755)
	r = runCmd(t, mpirun(t, 2, tinyFlags(model, data, out, "--do_train", "--do_eval")...))
	if want := "--output_dir: " + filepath.Join(out, evalResultsFile) + " is a directory"; r.code == 0 || !strings.Contains(r.output, want) ||
		!strings.Contains(r.output, "rank(s) 0 could not start") || strings.Contains(r.output, "Running training") {
		t.Errorf("a directory in place of eval_results.txt: exit %d, output lacks %q or trained:\n%s", r.code, want, r.output)
	}
	// One training line for two ranks: rank 1's shard is empty, and every rank says so.
	oneLine := t.TempDir()
	writeData(t, oneLine, 1, 4, 4)
	r = runCmd(t, mpirun(t, 2, tinyFlags(model, oneLine, filepath.Join(t.TempDir(), "out"), "--do_train")...))
	for rank := range 2 {
		want := fmt.Sprintf("finetune[rank %d]: error: rank 1 has 0 training examples (1 lines of %s for 2 ranks", rank, filepath.Join(oneLine, "train.tsv"))
		if r.code == 0 || !strings.Contains(r.output, want) || strings.Contains(r.output, "Running training") {
			t.Errorf("an empty shard: exit %d, output lacks %q or trained:\n%s", r.code, want, r.output)
		}
	}
}

// Both output streams of a command land whole in one lockedBuffer (run with -race, the
// detector also checks that os/exec's two copying goroutines never write it at once).
func TestLockedBufferTakesStdoutAndStderrTogether(t *testing.T) {
	out := &lockedBuffer{}
	cmd := exec.Command("sh", "-c", `i=0; while [ $i -lt 3000 ]; do echo "out $i"; echo "err $i" >&2; i=$((i+1)); done`)
	cmd.Stdout, cmd.Stderr = out, out
	if err := cmd.Run(); err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(strings.TrimSuffix(out.String(), "\n"), "\n")
	seen := map[string]bool{}
	for _, l := range lines {
		seen[l] = true
	}
	if len(lines) != 6000 || len(seen) != 6000 || !seen["out 2999"] || !seen["err 2999"] {
		t.Fatalf("%d lines (%d distinct) of 6000", len(lines), len(seen))
	}
}

// startUntilOutput starts cmd and returns once its output holds want.
func startUntilOutput(t *testing.T, cmd *exec.Cmd, want string) *lockedBuffer {
	t.Helper()
	out := &lockedBuffer{}
	cmd.Stdout, cmd.Stderr = out, out
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	for deadline := time.Now().Add(90 * time.Second); time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
		if strings.Contains(out.String(), want) {
			return out
		}
	}
	cmd.Process.Kill()
	cmd.Wait()
	t.Fatalf("no %q within 90s:\n%s", want, out.String())
	return nil
}

// SIGINT outside the training loop stops at once: during evaluation (rank 0 alone, no
// collective), with 128+SIGINT and no results file, and before training on 2 ranks, where the
// rank that got it makes every rank stop before the first step, with no checkpoint.
func TestSIGINTOutsideTrainingStopsPromptly(t *testing.T) {
	model := tinyModel(t, true)
	t.Run("evaluation", func(t *testing.T) {
		data, out := t.TempDir(), filepath.Join(t.TempDir(), "out")
		writeData(t, data, 4, 40000, 4)
		cmd := exec.Command(finetuneBinary(t), tinyFlags(model, data, out, "--do_eval", "--eval_batch_size=8")...)
		cmd.Env = append(os.Environ(), "TF_CPP_MIN_LOG_LEVEL=2", "CUDA_VISIBLE_DEVICES=")
		log := startUntilOutput(t, cmd, "using the weights of")
		sent := time.Now()
		if err := cmd.Process.Signal(syscall.SIGINT); err != nil {
			t.Fatal(err)
		}
		code, took := waitExit(t, cmd, sent, 30*time.Second)
		t.Logf("SIGINT during evaluation: exit %d after %v", code, took.Round(time.Millisecond))
		if code != 130 || !strings.Contains(log.String(), "finetune[rank 0]: interrupt: stopped during evaluation, exiting") ||
			strings.Contains(log.String(), "Eval results") {
			t.Errorf("exit %d (want 130), or no stop message, or results:\n%s", code, log.String())
		}
		entries, _ := os.ReadDir(out)
		for _, e := range entries {
			if strings.Contains(e.Name(), "eval_results") {
				t.Errorf("%s written by an interrupted evaluation", e.Name())
			}
		}
	})
	t.Run("before training, 2 ranks", func(t *testing.T) {
		data, out := t.TempDir(), filepath.Join(t.TempDir(), "out")
		writeData(t, data, 200000, 4, 4)
		cmd := mpirun(t, 2, tinyFlags(model, data, out, "--do_train", "--train_batch_size=4")...)
		log := startUntilOutput(t, cmd, "backend; model")
		pids := rankPIDs(t, cmd.Process.Pid)
		sent := time.Now()
		if err := syscall.Kill(pids[1], syscall.SIGINT); err != nil {
			t.Fatal(err)
		}
		code, took := waitExit(t, cmd, sent, 60*time.Second)
		output := log.String()
		t.Logf("SIGINT to rank 1 before training: exit %d after %v", code, took.Round(time.Millisecond))
		for r := range 2 {
			if !regexp.MustCompile(fmt.Sprintf(`finetune\[rank %d\]: interrupt: stopped (during setup|before training), exiting`, r)).MatchString(output) {
				t.Errorf("rank %d did not stop before training:\n%s", r, output)
			}
		}
		if _, step, ok, err := checkpoint.Latest(out); ok || err != nil || code != 130 || strings.Contains(output, "Running training") {
			t.Errorf("exit %d (want 130); checkpoint of step %d (%v, %v), or training started:\n%s", code, step, ok, err, output)
		}
	})
}

// SIGINT to rank 1 after it agreed to its last step, while rank 0 still trains it and writes
// the final checkpoint: too late to stop the training, it stops the job from there as a signal
// to any rank does, saying so and exiting 130 (mpirun then ends rank 0's work after training),
// not 0 as a rank that was never interrupted.
func TestSIGINTToRank1AfterItsLastStepStopsTheJob(t *testing.T) {
	model := tinyModel(t, false)
	data, out := t.TempDir(), filepath.Join(t.TempDir(), "out")
	writeData(t, data, 320, 4, 4)
	// 320 examples, 32 a batch, 2 ranks: 5 steps, each long enough to hold rank 0 within it.
	cmd := mpirun(t, 2, tinyFlags(model, data, out, "--do_train", "--train_batch_size=32", "--num_train_epochs=1", "--export_dir=none")...)
	log := startUntilOutput(t, cmd, "backend; model")
	pids := rankPIDs(t, cmd.Process.Pid)
	if len(pids) != 2 {
		cmd.Process.Kill()
		t.Fatalf("rank processes %v, want 2", pids)
	}
	for deadline := time.Now().Add(60 * time.Second); !strings.Contains(log.String(), "step 4/5:"); time.Sleep(time.Millisecond) {
		if time.Now().After(deadline) {
			cmd.Process.Kill()
			t.Fatalf("no step 4 within 60s:\n%s", log.String())
		}
	}
	// Rank 0 is held in step 5 (or after it, in its final checkpoint: either way rank 1 is past
	// its last step's agreement, its stop request 0, once it has had the 3 s to get there).
	switch err := syscall.Kill(pids[0], syscall.SIGSTOP); {
	case errors.Is(err, syscall.ESRCH):
		cmd.Process.Kill()
		cmd.Wait()
		t.Skip("rank 0 had ended before it could be held")
	case err != nil:
		t.Fatal(err)
	}
	time.Sleep(3 * time.Second)
	sent := time.Now()
	if err := syscall.Kill(pids[1], syscall.SIGINT); err != nil {
		t.Fatal(err)
	}
	time.Sleep(500 * time.Millisecond)
	if err := syscall.Kill(pids[0], syscall.SIGCONT); err != nil {
		t.Fatal(err)
	}
	code, took := waitExit(t, cmd, sent, 60*time.Second)
	output := log.String()
	t.Logf("SIGINT to rank 1 after its last step: exit %d after %v", code, took.Round(time.Millisecond))
	if strings.Contains(output, "finetune[rank 1]: interrupt: exiting after the checkpoint of the last step") {
		t.Skip("rank 1 had not agreed to step 5 within 3 s: the signal went into that agreement instead")
	}
	if code != 130 || !strings.Contains(output, "finetune[rank 1]: interrupt: stopped after training, exiting") || !strings.Contains(output, "step 5/5:") {
		t.Errorf("exit %d (want 130), or rank 1 did not say it stopped after training, or step 5 was not trained:\n%s", code, output)
	}
	if got := latestStep(t, out); got != 5 {
		t.Errorf("latest checkpoint %d, want the last step's, 5", got)
	}
}
