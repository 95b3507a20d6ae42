// Package testenv finds what the tests need outside Go, with one policy for all of them: the
// project virtualenv's Python (the independent reference: TensorFlow reads what Go wrote, and
// computes what Go should have computed), the SavedModels and data under .cache.
//
// A missing fixture skips the test with a message naming it and the make target that makes it,
// so that `go test ./...` runs on a machine without them; with GOROVOD_TEST_REQUIRE set (make
// test and make test-data set it) it fails the test instead, so that CI cannot pass by skipping.
//
// It imports the standard library only and sits under tf, the bottom of the layout, so that the
// tests of every package (horovod's included, which link no TensorFlow) can import it.
package testenv

import (
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
)

// RequireVar is the environment variable that turns a missing fixture from a skip into a failure.
const RequireVar = "GOROVOD_TEST_REQUIRE"

// Fixture is a file or directory of the repository that a make target makes.
type Fixture struct {
	Rel    string // path relative to the repository root
	What   string // what it is, for the message
	Target string // the make target that makes it
}

// The fixtures of `make setup`.
var (
	VenvPython = Fixture{".venv/bin/python", "the project virtualenv's Python", "make setup"}
	TinyModel  = Fixture{".cache/model/tiny", "the tiny training SavedModel", "make setup"}
)

// Path is the fixture's absolute path, whether it exists or not.
func (f Fixture) Path() string { return filepath.Join(Root(), f.Rel) }

// missing says why the fixture cannot be used, "" when it is there.
func (f Fixture) missing() string {
	if _, err := os.Stat(f.Path()); err != nil {
		return fmt.Sprintf("%s is missing (%s): run `%s`", f.What, f.Path(), f.Target)
	}
	return ""
}

// Require returns the fixture's path; when it is missing, it skips t, or fails it under
// GOROVOD_TEST_REQUIRE.
func (f Fixture) Require(t testing.TB) string {
	t.Helper()
	if msg := f.missing(); msg != "" {
		if os.Getenv(RequireVar) != "" {
			t.Fatal(msg)
		} else {
			t.Skip(msg)
		}
	}
	return f.Path()
}

// RequireMain is Require for a TestMain whose every test needs the fixture: when it is missing,
// it prints why and exits, with 0 (the package's tests skipped) or, under GOROVOD_TEST_REQUIRE, 1.
func (f Fixture) RequireMain() string {
	if msg := f.missing(); msg != "" {
		fmt.Fprintf(os.Stderr, "skipping every test of this package: %s\n", msg)
		if os.Getenv(RequireVar) != "" {
			os.Exit(1)
		}
		os.Exit(0)
	}
	return f.Path()
}

// Root is the repository root: two directories above this file.
func Root() string {
	_, file, _, _ := runtime.Caller(0)
	return filepath.Clean(filepath.Join(filepath.Dir(file), "..", ".."))
}

// Python runs script with the project virtualenv's Python and returns its standard output; a
// non-zero exit fails the test with the script's standard error.
func Python(t testing.TB, script string, args ...string) []byte {
	t.Helper()
	cmd := exec.Command(VenvPython.Require(t), append([]string{"-c", script}, args...)...)
	cmd.Env = append(os.Environ(), "TF_CPP_MIN_LOG_LEVEL=2", "CUDA_VISIBLE_DEVICES=")
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		t.Fatalf("testenv: python: %v\n%s", err, stderr.Bytes())
	}
	return stdout.Bytes()
}

// CPU names this machine's processor and the instruction sets that make oneDNN choose other
// kernels (AVX-512, its BF16 and FP16 extensions, AMX), for the failure message of a test that
// holds TensorFlow's float results to a tolerance: rounding differs from CPU to CPU, so a bound
// that held on one may not on another, and the message should say which CPU broke it.
func CPU() string {
	b, err := os.ReadFile("/proc/cpuinfo")
	if err != nil {
		return runtime.GOARCH + " (no /proc/cpuinfo)"
	}
	model, flags := runtime.GOARCH, map[string]bool{}
	for _, line := range strings.Split(string(b), "\n") {
		k, v, ok := strings.Cut(line, ":")
		if !ok {
			continue
		}
		switch strings.TrimSpace(k) {
		case "model name":
			model = strings.TrimSpace(v)
		case "flags":
			for _, f := range strings.Fields(v) {
				flags[f] = true
			}
		}
		if len(flags) > 0 && model != runtime.GOARCH {
			break
		}
	}
	var have []string
	for _, f := range []string{"avx2", "avx512f", "avx512_bf16", "avx512_fp16", "amx_bf16"} {
		if flags[f] {
			have = append(have, f)
		}
	}
	return fmt.Sprintf("CPU %s with %s", model, strings.Join(have, ", "))
}
