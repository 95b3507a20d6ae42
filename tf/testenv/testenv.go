// Package testenv gives the tests the repository root and the project's Python, which
// they use as the independent reference (TensorFlow reads what Go wrote, and computes what Go
// should have computed).
package testenv

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
)

// Root returns the repository root: the nearest directory above the working directory that
// holds go.mod.
func Root(t testing.TB) string {
	t.Helper()
	dir, err := os.Getwd()
	if err != nil {
		t.Fatal(err)
	}
	for {
		if _, err := os.Stat(filepath.Join(dir, "go.mod")); err == nil {
			return dir
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			t.Fatal("testenv: no go.mod above the working directory")
		}
		dir = parent
	}
}

// Python runs script with the project virtualenv's Python (made by `make setup`) and returns its
// standard output; a non-zero exit fails the test with the script's standard error.
func Python(t testing.TB, script string, args ...string) []byte {
	t.Helper()
	py := filepath.Join(Root(t), ".venv", "bin", "python")
	if _, err := os.Stat(py); err != nil {
		t.Fatalf("testenv: %s missing: run `make setup` first", py)
	}
	cmd := exec.Command(py, append([]string{"-c", script}, args...)...)
	cmd.Env = append(os.Environ(), "TF_CPP_MIN_LOG_LEVEL=2", "CUDA_VISIBLE_DEVICES=")
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		t.Fatalf("testenv: python: %v\n%s", err, stderr.Bytes())
	}
	return stdout.Bytes()
}
