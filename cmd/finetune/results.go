package main

import (
	"errors"
	"fmt"
	"math"
	"os"
	"strconv"
	"strings"

	"github.com/gorovod/gorovod/tf/atomicfile"
	"github.com/gorovod/gorovod/tf/summary"
)

// evalResult is what run_classifier writes to eval_results.txt.
type evalResult struct {
	Accuracy   float64 // correct / real examples
	Loss       float64 // mean loss over the real examples (eval_loss)
	BatchLoss  float64 // mean over eval batches of each batch's mean loss (Estimator's `loss`)
	GlobalStep int64
	Examples   int // real examples evaluated (logged, not written: run_classifier does not)
	// Precision of the train step, written with --amp only (run_classifier's file has
	// four keys); LossScale the final loss scale of a float16 run, written when not 0.
	Precision string
	LossScale float64
}

// writeEvalResults writes eval_results.txt as run_classifier does: `key = value` lines sorted by
// key, floats as Python prints a numpy float32. The file is replaced atomically.
func writeEvalResults(path string, r evalResult) error {
	lines := []string{
		"eval_accuracy = " + pyFloat32(r.Accuracy),
		"eval_loss = " + pyFloat32(r.Loss),
		"global_step = " + strconv.FormatInt(r.GlobalStep, 10),
		"loss = " + pyFloat32(r.BatchLoss),
	}
	if r.LossScale != 0 {
		lines = append(lines, "loss_scale = "+pyFloat32(r.LossScale))
	}
	if r.Precision != "" {
		lines = append(lines, "precision = "+r.Precision)
	}
	if err := atomicfile.RemoveStale(path); err != nil { // rank 0 holds --output_dir
		return err
	}
	return atomicfile.Write(path, []byte(strings.Join(lines, "\n")+"\n"))
}

// evalSummaryDir is where Estimator's evaluate writes its TensorBoard events, under the model
// directory: TensorBoard shows its points beside the training curves as the run "eval".
const evalSummaryDir = "eval"

// writeEvalSummary writes r's metrics at its global step to a new events file in dir, under the
// tags Estimator's evaluate gives run_classifier's (eval_accuracy, eval_loss, loss), and a
// float16 run's loss_scale.
func writeEvalSummary(dir string, r evalResult) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	w, err := summary.Create(dir)
	if err != nil {
		return err
	}
	values := map[string]float64{"eval_accuracy": r.Accuracy, "eval_loss": r.Loss, "loss": r.BatchLoss}
	if r.LossScale != 0 {
		values["loss_scale"] = r.LossScale
	}
	return errors.Join(w.Scalars(r.GlobalStep, values), w.Close())
}

// pyFloat32 formats v as Python's str() of a numpy float32: the shortest digits that read back
// as the same float32, positional with ".0" on integral values from 1e-4 up to 1e16 (and for
// 0), scientific outside, and nan, inf, -inf (a diverged run's loss).
func pyFloat32(v float64) string {
	f := float64(float32(v))
	switch {
	case math.IsNaN(f):
		return "nan"
	case math.IsInf(f, 0):
		return strings.ToLower(strings.TrimPrefix(strconv.FormatFloat(f, 'g', -1, 32), "+")) // inf, -inf
	case f != 0 && (math.Abs(f) < 1e-4 || math.Abs(f) >= 1e16):
		return strconv.FormatFloat(f, 'e', -1, 32)
	}
	s := strconv.FormatFloat(f, 'f', -1, 32)
	if !strings.Contains(s, ".") {
		s += ".0"
	}
	return s
}

// testResultsWriter streams test_results.tsv: one line of tab-separated class probabilities per
// real example, in input order, as run_classifier's predict output. Rows become visible only at
// Close, by rename.
type testResultsWriter struct {
	f    *atomicfile.File
	rows int
}

func createTestResults(path string) (*testResultsWriter, error) {
	if err := atomicfile.RemoveStale(path); err != nil { // rank 0 holds --output_dir
		return nil, err
	}
	f, err := atomicfile.Create(path)
	if err != nil {
		return nil, err
	}
	return &testResultsWriter{f: f}, nil
}

// Write appends the rows of probs ([n*numLabels], row-major) for the first n examples.
func (t *testResultsWriter) Write(probs []float32, n, numLabels int) error {
	if len(probs) < n*numLabels {
		return fmt.Errorf("test results: %d probabilities for %d examples of %d labels", len(probs), n, numLabels)
	}
	for i := range n {
		for j := range numLabels {
			if j > 0 {
				t.f.WriteByte('\t')
			}
			t.f.WriteString(pyFloat32(float64(probs[i*numLabels+j])))
		}
		if err := t.f.WriteByte('\n'); err != nil {
			return fmt.Errorf("test results: %w", err)
		}
	}
	t.rows += n
	return nil
}

// Close makes the file visible under its name.
func (t *testResultsWriter) Close() error { return t.f.Commit() }

// Abort discards what was written.
func (t *testResultsWriter) Abort() { t.f.Abort() }
