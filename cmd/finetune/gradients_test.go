package main

import (
	"fmt"
	"path/filepath"
	"strings"
	"testing"
)

// With the NCCL backend the gradients live in its pinned host memory (horovod's AllocHost),
// which the allreduce reduces in place. Over nccl/testdata's fake CUDA runtime and NCCL (one
// "GPU"), a one-rank run on NCCL (where the fake's allreduce in place leaves the gradients as they
// are, as a real one-rank sum does) must say so on rank 0 and train to exactly the variables and
// losses of the same run on MPI (at one rank horovod's local backend), whose gradients are in Go memory.
func TestGradientsInNCCLPinnedMemory(t *testing.T) {
	model := tinyModel(t, false)
	data := t.TempDir()
	writeData(t, data, 24, 4, 4)
	fakeCUDARuntime(t)
	t.Setenv("FAKE_CUDA_DEVICES", "1")
	t.Setenv("GOROVOD_NCCL_LIBRARY", fakeLibrary(t, "libnccl.so", "-DFAKE_NCCL"))
	common := []string{"--do_train", "--num_train_epochs=1", "--train_batch_size=8", "--learning_rate=2e-3", "--warmup_proportion=0",
		"--shuffle_buffer=0", "--save_checkpoints_steps=0", "--export_dir=none", "--seed=3"}
	const logged = "finetune: gradients in the nccl backend's pinned host memory"
	var runs []string
	// --allreduce_backend=mpi on one rank runs horovod's local backend, in Go memory too.
	for _, b := range []struct{ flag, backend string }{{"mpi", "local"}, {"nccl", "nccl"}} {
		dir := filepath.Join(t.TempDir(), b.flag)
		out := mustSucceed(t, mpirun(t, 1, tinyFlags(model, data, dir, append(common, "--allreduce_backend="+b.flag)...)...))
		if !strings.Contains(out, "1 rank(s), "+b.backend+" backend") || strings.Contains(out, logged) != (b.flag == "nccl") {
			t.Fatalf("--allreduce_backend=%s: want the %s backend, and %q logged only on NCCL:\n%s", b.flag, b.backend, logged, out)
		}
		runs = append(runs, dir)
	}
	got := diffRuns(t, runs...)
	if got[0].Steps != 3 || got[0].Variables < 3*40 {
		t.Fatalf("compared %d steps and %d variables, want 3 steps and every variable with its slots", got[0].Steps, got[0].Variables)
	}
	// Bit for bit: both runs are one rank with the same flags, batches and threads, so TensorFlow
	// computes the same; only where the gradients live differs (and a one-rank sum is the identity).
	if got[0].MaxLossDiff != 0 || got[0].MaxWeightDiff != 0 {
		t.Errorf("NCCL with the gradients in pinned memory differs from MPI: losses by %g, variables by %g (want identical)", got[0].MaxLossDiff, got[0].MaxWeightDiff)
	}
}

// With more than one rank the word embeddings' gradient travels as the rows the batches looked
// up (allgathered, then added into the dense gradient); --sparse_as_dense allreduces it whole.
// Both must train alike, to the bit at 2 ranks: the ranks compute the same in both runs, the
// rows nobody looked up are zero either way, and each looked-up row ends as rank 0's value plus
// rank 1's (two addends: the same sum in any order), as the dense allreduce's sum is.
func TestWordEmbeddingRowsTrainAsTheDenseAllreduce(t *testing.T) {
	model := tinyModel(t, false)
	data := t.TempDir()
	writeData(t, data, 24, 4, 4)
	common := []string{"--do_train", "--num_train_epochs=1", "--train_batch_size=4", "--learning_rate=2e-3", "--warmup_proportion=0",
		"--shuffle_buffer=0", "--save_checkpoints_steps=0", "--export_dir=none", "--seed=3"}
	const rows = "the word embeddings' gradient"
	var runs []string
	for _, dense := range []bool{false, true} {
		dir := filepath.Join(t.TempDir(), fmt.Sprint("dense-", dense))
		out := mustSucceed(t, mpirun(t, 2, tinyFlags(model, data, dir, append(common, fmt.Sprint("--sparse_as_dense=", dense))...)...))
		if strings.Contains(out, rows) == dense {
			t.Fatalf("--sparse_as_dense=%v: want %q logged only without it:\n%s", dense, rows, out)
		}
		runs = append(runs, dir)
	}
	got := diffRuns(t, runs...)[0]
	if got.Steps != 3 || got.MaxLossDiff != 0 || got.MaxWeightDiff != 0 {
		t.Errorf("rows against the dense allreduce over %d steps: losses differ by %g, variables by %g (want 3 steps, identical)",
			got.Steps, got.MaxLossDiff, got.MaxWeightDiff)
	}
}
