package main

import (
	"errors"
	"fmt"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/gorovod/gorovod/nccl"
)

// fakeCUDARuntime builds nccl's test stand-in for libcudart (nccl/testdata/fakelib.c, whose
// device count FAKE_CUDA_DEVICES sets) and points discovery at it.
func fakeCUDARuntime(t *testing.T) {
	t.Helper()
	t.Setenv("GOROVOD_CUDART_LIBRARY", fakeLibrary(t, "libcudart.so", "-DFAKE_CUDA"))
	t.Setenv("FAKE_FAIL", "")
}

// fakeLibrary builds nccl/testdata/fakelib.c as the stand-in library name (define selects
// which) and returns its path.
func fakeLibrary(t *testing.T, name, define string) string {
	t.Helper()
	out := filepath.Join(t.TempDir(), name)
	if b, err := exec.Command("gcc", "-shared", "-fPIC", "-o", out, define, "../../nccl/testdata/fakelib.c").CombinedOutput(); err != nil {
		t.Fatalf("building the stand-in %s: %v\n%s", name, err, b)
	}
	return out
}

// requireTensorFlowGPU skips a test made for the other build of TensorFlow: with GPU kernels
// (tensorflow[and-cuda], the GPU image's) or without (tensorflow-cpu, make setup's).
func requireTensorFlowGPU(t *testing.T, want bool) {
	t.Helper()
	has, err := tensorFlowHasGPU()
	if err != nil {
		t.Fatal(err)
	}
	if has != want {
		t.Skipf("this TensorFlow has GPU kernels: %v; the test needs %v", has, want)
	}
}

// The placement holds on every backend, not only NCCL's: each rank's TensorFlow sees the GPU of
// its local rank, the rank logs it, and more ranks than GPUs stops the rank before training.
func TestPlaceGPU(t *testing.T) {
	var logged []string
	logf := func(format string, args ...any) { logged = append(logged, fmt.Sprintf(format, args...)) }

	t.Run("two GPUs, local rank 1 of 2", func(t *testing.T) {
		fakeCUDARuntime(t)
		t.Setenv("FAKE_CUDA_DEVICES", "2")
		logged = nil
		visible, err := placeGPU(nccl.Options{}, 1, 2, logf)
		if err != nil || visible != "1" {
			t.Fatalf("placeGPU = %q, %v; want visible_device_list \"1\"", visible, err)
		}
		// The fake bus id of device 1 (NVML, absent here, would add the name and memory).
		if len(logged) != 1 || !strings.Contains(logged[0], "local rank 1: GPU 1") || !strings.Contains(logged[0], "0000:11:00.0") {
			t.Errorf("logged %q, want the GPU of local rank 1 with its PCI bus id", logged)
		}
	})
	t.Run("one GPU, two ranks on the machine", func(t *testing.T) {
		fakeCUDARuntime(t)
		t.Setenv("FAKE_CUDA_DEVICES", "1")
		for rank := range 2 {
			_, err := placeGPU(nccl.Options{}, rank, 2, logf)
			var pe *nccl.PlacementError
			if !errors.As(err, &pe) || pe.LocalSize != 2 || pe.Devices != 1 {
				t.Errorf("local rank %d: %v, want a *nccl.PlacementError for 2 ranks on 1 GPU", rank, err)
			}
		}
	})
	t.Run("a CUDA runtime that sees no GPU: CPU", func(t *testing.T) {
		fakeCUDARuntime(t)
		t.Setenv("FAKE_CUDA_DEVICES", "0")
		logged = nil
		if visible, err := placeGPU(nccl.Options{}, 0, 2, logf); err != nil || visible != "" || logged != nil {
			t.Fatalf("placeGPU = %q, %v (logged %q); want a CPU run", visible, err, logged)
		}
	})
	t.Run("no CUDA runtime: CPU", func(t *testing.T) {
		t.Setenv("GOROVOD_CUDART_LIBRARY", filepath.Join(t.TempDir(), "libcudart.so.12"))
		if visible, err := placeGPU(nccl.Options{}, 0, 4, logf); err != nil || visible != "" {
			t.Fatalf("placeGPU = %q, %v; want a CPU run", visible, err)
		}
	})
	t.Run("a CUDA runtime that fails: the error", func(t *testing.T) {
		fakeCUDARuntime(t)
		t.Setenv("FAKE_CUDA_DEVICES", "2")
		t.Setenv("FAKE_FAIL", "cudaGetDeviceCount:999")
		if _, err := placeGPU(nccl.Options{}, 0, 1, logf); err == nil || !strings.Contains(err.Error(), "cudaGetDeviceCount") {
			t.Fatalf("placeGPU with a failing runtime: %v", err)
		}
	})
}

// Two ranks on a machine with one GPU stop before training on the MPI backend too, each saying
// why: before the fix only the NCCL backend placed the ranks, and both sessions shared the GPU.
func TestMoreRanksThanGPUsFailBeforeTrainingOnMPI(t *testing.T) {
	requireTensorFlowGPU(t, true)
	r := trainTwoRanksBesideOneGPU(t)
	for rank := range 2 {
		want := fmt.Sprintf("finetune[rank %d]: error: nccl: 2 ranks on this machine but only 1 GPU(s) visible (local rank 1 has none)", rank)
		if r.code == 0 || !strings.Contains(r.output, want) || strings.Contains(r.output, "Running training") {
			t.Errorf("exit %d, output lacks %q or trained:\n%s", r.code, want, r.output)
		}
	}
}

// A CPU build of TensorFlow (tensorflow-cpu, what make setup installs) computes on the CPU on a
// machine with a GPU and a CUDA runtime too: its ranks are not placed on the GPU, where two of
// them beside one GPU stopped with "2 ranks on this machine but only 1 GPU(s) visible", and --amp
// chooses as on a CPU, where it chose float16 "on a GPU" that TensorFlow does not use.
func TestCPUTensorFlowBesideAGPURunsOnCPU(t *testing.T) {
	requireTensorFlowGPU(t, false)
	r := trainTwoRanksBesideOneGPU(t, "--train_batch_size=4", "--amp")
	if r.code != 0 || strings.Contains(r.output, "GPU 0") || strings.Contains(r.output, "precision: float16") || !strings.Contains(r.output, "saved checkpoint") {
		t.Errorf("exit %d, want training on the CPU, no GPU placed and no float16:\n%s", r.code, r.output)
	}
}

// trainTwoRanksBesideOneGPU trains the tiny model on 2 ranks over MPI on a machine whose (fake)
// CUDA runtime sees one GPU.
func trainTwoRanksBesideOneGPU(t *testing.T, flags ...string) result {
	model := tinyModel(t, true)
	data := t.TempDir()
	writeData(t, data, 16, 4, 4)
	fakeCUDARuntime(t)
	t.Setenv("FAKE_CUDA_DEVICES", "1")
	flags = append([]string{"--do_train", "--allreduce_backend=mpi"}, flags...)
	return runCmd(t, mpirun(t, 2, tinyFlags(model, data, filepath.Join(t.TempDir(), "out"), flags...)...))
}
