package main

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/gorovod/gorovod/tf/testenv"
)

// fakeNodesEnv is set by `make test-multinode`, which runs the tests that simulate machines.
const fakeNodesEnv = "GOROVOD_TEST_FAKE_NODES"

// onFakeNodes returns the command that runs finetune with one rank per slot of layout
// (HOST:SLOTS,...), each host a machine simulated by scripts/fake-nodes/mpirun.sh. As between
// real machines, the ranks get only the environment passed with -x: here the fake CUDA runtime's.
func onFakeNodes(t *testing.T, layout string, args ...string) *exec.Cmd {
	t.Helper()
	full := []string{"-k", "10", "120", filepath.Join(testenv.Root(), "scripts", "fake-nodes", "mpirun.sh"), layout}
	for _, v := range []string{"GOROVOD_CUDART_LIBRARY", "FAKE_CUDA_DEVICES", "FAKE_FAIL", "TF_CPP_MIN_LOG_LEVEL", "CUDA_VISIBLE_DEVICES"} {
		full = append(full, "-x", v)
	}
	full = append(full, finetuneBinary(t))
	cmd := exec.Command("timeout", append(full, args...)...)
	cmd.Env = append(os.Environ(), "OMPI_ALLOW_RUN_AS_ROOT=1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1",
		"TF_CPP_MIN_LOG_LEVEL=2", "CUDA_VISIBLE_DEVICES=")
	return cmd
}

// Two machines, simulated: each rank takes the GPU of its local rank on its own machine, and
// "more ranks than GPUs" is counted per machine, not per job. A job over two machines of two
// GPUs each trains as one rank with four times the batch (as TestTwoRanksEqualOneRankWithDoubleBatch
// on one machine), its ranks talking over TCP.
func TestTwoMachines(t *testing.T) {
	if os.Getenv(fakeNodesEnv) == "" {
		t.Skip("simulates two machines with unshare --uts (root): run `make test-multinode`")
	}
	t.Run("2+2 ranks, 2 GPUs each: placed by local rank, trains as 1 rank x 4 batch", func(t *testing.T) {
		model := tinyModel(t, false)
		data := t.TempDir()
		const b, steps = 2, 4
		writeData(t, data, 4*b*steps, 8, 8)
		fakeCUDARuntime(t)
		t.Setenv("FAKE_CUDA_DEVICES", "2")
		common := []string{"--do_train", "--num_train_epochs=1", "--warmup_proportion=0", "--shuffle_buffer=0",
			"--save_checkpoints_steps=0", "--export_dir=none", "--seed=3", "--allreduce_backend=mpi"}
		one, four := filepath.Join(t.TempDir(), "one"), filepath.Join(t.TempDir(), "four")
		mustSucceed(t, mpirun(t, 1, tinyFlags(model, data, one, append(common, "--train_batch_size=8", "--learning_rate=4e-3")...)...))
		out := mustSucceed(t, onFakeNodes(t, "nodea:2,nodeb:2", tinyFlags(model, data, four, append(common, "--train_batch_size=2", "--learning_rate=1e-3")...)...))
		// Where TensorFlow can use a GPU: a CPU build is not placed (TestCPUTensorFlowBesideAGPURunsOnCPU).
		tfGPU, err := tensorFlowHasGPU()
		if err != nil {
			t.Fatal(err)
		}
		for rank := range 4 {
			// Ranks 0, 1 on nodea and 2, 3 on nodeb: local ranks 0, 1 on each.
			if want := fmt.Sprintf("finetune[rank %d]: local rank %d: GPU %d", rank, rank%2, rank%2); tfGPU && !strings.Contains(out, want) {
				t.Errorf("output lacks %q:\n%s", want, out)
			}
		}
		got := diffRuns(t, one, four)
		t.Logf("2 machines x 2 ranks against 1 rank: %+v", got[0])
		if got[0].Steps != steps || got[0].Variables < 3*40 {
			t.Fatalf("compared %d steps and %d variables, want %d steps and every variable with its slots", got[0].Steps, got[0].Variables, steps)
		}
		if got[0].MaxLossDiff > 1e-5 || got[0].MaxWeightDiff > 1e-5 {
			t.Errorf("4 ranks on 2 machines x batch %d differ from 1 rank x batch %d: loss by %g, weights by %g (bound 1e-5; rounding depends on the %s)",
				b, 4*b, got[0].MaxLossDiff, got[0].MaxWeightDiff, testenv.CPU())
		}
	})
	t.Run("2+1 ranks, 1 GPU each: the 2-rank machine stops the job", func(t *testing.T) {
		requireTensorFlowGPU(t, true)
		model := tinyModel(t, false) // the model of the first subtest: exported once
		data := t.TempDir()
		writeData(t, data, 16, 4, 4)
		fakeCUDARuntime(t)
		t.Setenv("FAKE_CUDA_DEVICES", "1")
		r := runCmd(t, onFakeNodes(t, "nodea:2,nodeb:1", tinyFlags(model, data, filepath.Join(t.TempDir(), "out"), "--do_train", "--allreduce_backend=mpi")...))
		wants := []string{"finetune[rank 2]: local rank 0: GPU 0", "finetune[rank 2]: error: rank(s) 0, 1 could not start"}
		for rank := range 2 {
			wants = append(wants, fmt.Sprintf("finetune[rank %d]: error: nccl: 2 ranks on this machine but only 1 GPU(s) visible (local rank 1 has none)", rank))
		}
		for _, want := range wants {
			if !strings.Contains(r.output, want) {
				t.Errorf("output lacks %q", want)
			}
		}
		if r.code == 0 || strings.Contains(r.output, "Running training") || strings.Contains(r.output, "finetune[rank 2]: error: nccl") {
			t.Errorf("exit %d: want a failure before training, with rank 2 placed:\n%s", r.code, r.output)
		}
		if t.Failed() {
			t.Logf("output:\n%s", r.output)
		}
	})
}
