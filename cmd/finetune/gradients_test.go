package main

import (
	"path/filepath"
	"strings"
	"testing"
)

// float32View takes aligned memory as it is and refuses what float32 values cannot lie in.
func TestFloat32View(t *testing.T) {
	mem := make([]byte, 17)
	v, err := float32View(mem[:16])
	if err != nil || len(v) != 4 {
		t.Fatalf("16 aligned bytes: %d values, %v", len(v), err)
	}
	v[3] = -2
	if mem[15] != 0xc0 { // -2 is 0xc0000000, little-endian on every platform Go and CUDA share
		t.Errorf("a write to the view does not reach the memory: % x", mem[12:16])
	}
	for _, b := range [][]byte{mem[1:5], mem[:6]} {
		if _, err := float32View(b); err == nil || !strings.Contains(err.Error(), "not an array of float32") {
			t.Errorf("%d bytes at offset %d: %v, want an error", len(b), cap(mem)-cap(b), err)
		}
	}
}

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
