package datatests

import (
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// install creates an empty MiniLM model folder in venv as pip lays it out for python.
func install(t *testing.T, venv, python string) string {
	t.Helper()
	dir := filepath.Join(venv, "lib", python, "site-packages", miniLMPackage, "model")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	return dir
}

// The GPU image's venv has Python 3.12, the CPU machines' 3.11: both must be found.
func TestMiniLMDirInAnyPython3(t *testing.T) {
	for _, python := range []string{"python3.11", "python3.12", "python3.13"} {
		venv := t.TempDir()
		want := install(t, venv, python)
		got, err := miniLMDirIn(venv)
		if err != nil || got != want {
			t.Errorf("%s: miniLMDirIn = %q, %v; want %q", python, got, err, want)
		}
	}
}

func TestMiniLMDirInMissingOrAmbiguous(t *testing.T) {
	venv := t.TempDir()
	if _, err := miniLMDirIn(venv); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("empty venv: error %v, want fs.ErrNotExist", err)
	}
	install(t, venv, "python3.11")
	install(t, venv, "python3.12")
	_, err := miniLMDirIn(venv)
	if err == nil || errors.Is(err, fs.ErrNotExist) || !strings.Contains(err.Error(), "several Pythons") {
		t.Errorf("two Pythons: error %v, want one naming both", err)
	}
}
