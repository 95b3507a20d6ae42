package nccl

import (
	"os"
	"os/exec"
	"path/filepath"
	"testing"
)

// The CPU tests load testdata/fakelib.c, built here with gcc, in place of libcudart and
// libnccl: it exports the symbols the binding looks up and returns the error codes a test
// asks for, which lets the tests drive our discovery, dlopen/dlsym, argument checks and
// error mapping without a GPU. It computes nothing; real results are checked on a GPU
// (gpu_test.go, scripts/gpu-check.sh).

var fakeDir string

func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "nccl-fake-")
	if err != nil {
		panic(err)
	}
	fakeDir = dir
	code := m.Run()
	os.RemoveAll(dir)
	os.Exit(code)
}

// fakeLib builds (once per variant) and returns the path of a fake library: variant is
// "cuda" or "nccl", optionally with "-omit" (one required symbol left out).
func fakeLib(t *testing.T, variant string) string {
	t.Helper()
	out := filepath.Join(fakeDir, "lib"+variant+".so")
	if _, err := os.Stat(out); err == nil {
		return out
	}
	// gcc is always there where the package is built (cgo needs it), but a GPU host may run a
	// prebuilt test binary (scripts/gpu-check.sh --prebuilt) without a compiler: there the
	// stand-in tests skip and the real-GPU tests still run.
	if _, err := exec.LookPath("gcc"); err != nil {
		t.Skipf("gcc is not on PATH to build the fake %s library (testdata/fakelib.c): %v", variant, err)
	}
	args := []string{"-shared", "-fPIC", "-o", out, "testdata/fakelib.c"}
	switch variant {
	case "cuda":
		args = append(args, "-DFAKE_CUDA")
	case "nccl":
		args = append(args, "-DFAKE_NCCL")
	case "cuda-omit":
		args = append(args, "-DFAKE_CUDA", "-DFAKE_OMIT_SYMBOL")
	case "nccl-omit":
		args = append(args, "-DFAKE_NCCL", "-DFAKE_OMIT_SYMBOL")
	default:
		t.Fatalf("unknown fake variant %q", variant)
	}
	if b, err := exec.Command("gcc", args...).CombinedOutput(); err != nil {
		t.Fatalf("building fake library: %v\n%s", err, b)
	}
	return out
}

// fakeRuntime loads the fake CUDA runtime with the given number of devices.
func fakeRuntime(t *testing.T, devices string) *Runtime {
	t.Helper()
	t.Setenv("FAKE_CUDA_DEVICES", devices)
	rt, err := LoadRuntime(Options{RuntimePath: fakeLib(t, "cuda")})
	if err != nil {
		t.Fatal(err)
	}
	return rt
}

// fakeNCCL loads the fake NCCL over a fake runtime with the given number of devices.
func fakeNCCL(t *testing.T, devices string) *Library {
	t.Helper()
	lib, err := Load(fakeRuntime(t, devices), Options{LibraryPath: fakeLib(t, "nccl")})
	if err != nil {
		t.Fatal(err)
	}
	return lib
}
