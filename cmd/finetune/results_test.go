package main

import (
	"math"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/gorovod/gorovod/tf/testenv"
)

// Our float formatting must be Python's str(numpy.float32(x)) for the values these files hold.
func TestPyFloat32MatchesNumpy(t *testing.T) {
	inf := float32(math.Inf(1))
	values := []float32{0, 1, 0.5, 0.1, 1e-5, 1.2345678e-7, 0.99999994, 0.8125, 0.33333334, 3, 0.00012345,
		1e-4, 1.0001e-4, -2.5, 1e6, 16777216, 123456.7, 32768, 1e15, 9.999999e15, 1e16, 3.4028235e38,
		float32(math.NaN()), inf, -inf}
	var args []string
	var got []string
	for _, v := range values {
		args = append(args, pyFloat32(float64(v)))
		got = append(got, pyFloat32(float64(v)))
	}
	out := testenv.Python(t, `
import sys, numpy as np
print("\n".join(str(np.float32(a)) for a in sys.argv[1:]))
`, args...)
	want := strings.Split(strings.TrimSpace(string(out)), "\n")
	for i := range values {
		if got[i] != want[i] {
			t.Errorf("%v: ours %q, numpy %q", values[i], got[i], want[i])
		}
	}
}

func TestEvalAndTestResultFiles(t *testing.T) {
	dir := t.TempDir()
	p := filepath.Join(dir, "eval_results.txt")
	// What a run killed while writing (kill -9) left: gone once the files are written again.
	for _, name := range []string{".eval_results.txt.tmp5x", ".test_results.tsv.tmp9y"} {
		os.WriteFile(filepath.Join(dir, name), []byte("half"), 0o644)
	}
	if err := writeEvalResults(p, evalResult{Accuracy: 0.875, Loss: 0.3, BatchLoss: 0.31, GlobalStep: 120}); err != nil {
		t.Fatal(err)
	}
	b, _ := os.ReadFile(p)
	if want := "eval_accuracy = 0.875\neval_loss = 0.3\nglobal_step = 120\nloss = 0.31\n"; string(b) != want {
		t.Fatalf("eval_results.txt:\n%s\nwant\n%s", b, want)
	}
	// With --amp: the precision, and a float16 run's final loss scale, after run_classifier's keys.
	if err := writeEvalResults(p, evalResult{Accuracy: 0.875, Loss: 0.3, BatchLoss: 0.31, GlobalStep: 120, Precision: "float16", LossScale: 16384}); err != nil {
		t.Fatal(err)
	}
	b, _ = os.ReadFile(p)
	if want := "eval_accuracy = 0.875\neval_loss = 0.3\nglobal_step = 120\nloss = 0.31\nloss_scale = 16384.0\nprecision = float16\n"; string(b) != want {
		t.Fatalf("eval_results.txt:\n%s\nwant\n%s", b, want)
	}
	// A bfloat16 run has no loss scale: the precision alone.
	if err := writeEvalResults(p, evalResult{Accuracy: 0.875, Loss: 0.3, BatchLoss: 0.31, GlobalStep: 120, Precision: "bfloat16"}); err != nil {
		t.Fatal(err)
	}
	b, _ = os.ReadFile(p)
	if want := "eval_accuracy = 0.875\neval_loss = 0.3\nglobal_step = 120\nloss = 0.31\nprecision = bfloat16\n"; string(b) != want {
		t.Fatalf("eval_results.txt:\n%s\nwant\n%s", b, want)
	}
	tp := filepath.Join(dir, "test_results.tsv")
	w, err := createTestResults(tp)
	if err != nil {
		t.Fatal(err)
	}
	// A padded last batch: 3 rows given, 2 real.
	if err := w.Write([]float32{0.25, 0.75, 1, 0, 0.5, 0.5}, 2, 2); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(tp); !os.IsNotExist(err) {
		t.Fatal("test_results.tsv visible before Close")
	}
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	b, _ = os.ReadFile(tp)
	if string(b) != "0.25\t0.75\n1.0\t0.0\n" {
		t.Fatalf("test_results.tsv %q", b)
	}
	if tmp, _ := filepath.Glob(filepath.Join(dir, ".*tmp*")); tmp != nil {
		t.Errorf("left behind: %v", tmp)
	}
}
