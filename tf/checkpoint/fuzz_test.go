package checkpoint

import (
	"math"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"
)

// FuzzReadState: a state file opens, or fails with an error naming it; one that opens is written
// back by the manager as a state file that reads as the same state (timestamps missing from it
// as 0, and the last preserved one as the manager's clock when it has none).
func FuzzReadState(f *testing.F) {
	for _, s := range []string{
		"model_checkpoint_path: \"model.ckpt-300\"\nall_model_checkpoint_paths: \"model.ckpt-200\"\nall_model_checkpoint_paths: \"model.ckpt-300\"\n" +
			"all_model_checkpoint_timestamps: 1712345678.25\nall_model_checkpoint_timestamps: 1712345699.5\nlast_preserved_timestamp: 1712345600.125\n",
		"model_checkpoint_path: \"/tmp/o\\'b/model.ckpt-2\"\nall_model_checkpoint_paths: '/tmp/o\\'b/model.ckpt-1'\n",
		"model_checkpoint_path : \"model.ckpt-1\"\nall_model_checkpoint_paths :\"model.ckpt-1\"\n# comment\nall_model_checkpoint_timestamps : 5\n",
		"model_checkpoint_path: model.ckpt-1\n", "all_model_checkpoint_paths: \"a\"\n", "model_checkpoint_path: \"\\x41\\101\\n\"\n", "",
	} {
		f.Add(s)
	}
	dir := f.TempDir()
	path := filepath.Join(dir, StateFile)
	now := time.Unix(1712345000, 0)
	f.Fuzz(func(t *testing.T, text string) {
		if err := os.WriteFile(path, []byte(text), 0o644); err != nil {
			t.Fatal(err)
		}
		m, err := open(dir, 0, 0, func() time.Time { return now })
		if err != nil {
			if !strings.Contains(err.Error(), path) {
				t.Fatalf("the error for %q does not name %s: %v", text, path, err)
			}
			return
		}
		st, err := readState(path)
		if err != nil {
			t.Fatal(err)
		}
		want := state{latest: st.latest, all: st.all, timestamps: make([]float64, len(st.all)), lastPreserved: st.lastPreserved}
		copy(want.timestamps, st.timestamps)
		if !(st.lastPreserved > 0) {
			want.lastPreserved = float64(now.Unix())
		}
		if err := m.writeState(); err != nil {
			t.Fatal(err)
		}
		written, _ := os.ReadFile(path)
		got, err := readState(path)
		if err != nil {
			t.Fatalf("%q opens, but is written back as %q, which does not read: %v", text, written, err)
		}
		bits := func(v []float64) []uint64 {
			out := make([]uint64, len(v))
			for i, x := range v {
				out[i] = math.Float64bits(x)
			}
			return out
		}
		if got.latest != want.latest || !slices.Equal(got.all, want.all) || !slices.Equal(bits(got.timestamps), bits(want.timestamps)) ||
			math.Float64bits(got.lastPreserved) != math.Float64bits(want.lastPreserved) {
			t.Fatalf("%q opens as %+v, but is written back as %q, which reads as %+v", text, want, written, got)
		}
	})
}

// FuzzStepOf: a prefix's step is the number after its last dash, or an error naming the prefix.
func FuzzStepOf(f *testing.F) {
	for _, s := range []string{"model.ckpt-1200", "/out/model.ckpt-0", "model.ckpt", "model.ckpt-", "model.ckpt-007"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, prefix string) {
		step, err := StepOf(prefix)
		if err != nil {
			if !strings.Contains(err.Error(), prefix) {
				t.Fatalf("the error for %q does not name it: %v", prefix, err)
			}
			return
		}
		i := strings.LastIndexByte(prefix, '-')
		if n, perr := strconv.ParseUint(prefix[i+1:], 10, 63); step < 0 || perr != nil || int64(n) != step {
			t.Fatalf("StepOf(%q) = %d", prefix, step)
		}
	})
}
