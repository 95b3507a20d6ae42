package trainer

import (
	"errors"
	"fmt"
	"maps"
	"os"
	"strings"
	"testing"

	"github.com/gorovod/gorovod/tf/summary"
)

// failingWriter records what reaches it and fails Scalars from failAt on, and Close when told.
type failingWriter struct {
	steps     []int64
	values    []map[string]float64
	failAt    int64
	closeErr  error
	closes    int
	afterFail int
}

func (w *failingWriter) Scalars(step int64, values map[string]float64) error {
	if w.failAt > 0 && step >= w.failAt {
		if step > w.failAt {
			w.afterFail++
		}
		return errors.New("no space left on device")
	}
	w.steps = append(w.steps, step)
	w.values = append(w.values, maps.Clone(values))
	return nil
}

func (w *failingWriter) SessionStart(step int64) error { return nil }
func (w *failingWriter) Close() error                  { w.closes++; return w.closeErr }
func (w *failingWriter) Path() string                  { return "/out/events.out.tfevents.1.host" }

func collect(lines *[]string) func(string, ...any) {
	return func(format string, args ...any) { *lines = append(*lines, fmt.Sprintf(format, args...)) }
}

// Losing the summaries does not stop training, and is never silent: a write that fails is one
// warning naming the file and the step, then nothing more is written; a close that fails is a
// warning too; a file written in full closes without one.
func TestSummariesWarnOnceAndNeverStopTraining(t *testing.T) {
	var warned []string
	w := &failingWriter{failAt: 3}
	s := newSummaries(w, collect(&warned))
	for step := int64(1); step <= 5; step++ {
		s.write(step, float64(step), 0.1, 2, 30, 0.5)
	}
	s.close()
	s.close()
	if fmt.Sprint(w.steps) != "[1 2]" || w.afterFail != 0 || w.closes != 1 {
		t.Errorf("steps written %v, writes after the failure %d, closes %d", w.steps, w.afterFail, w.closes)
	}
	if len(warned) != 1 || !strings.Contains(warned[0], w.Path()) || !strings.Contains(warned[0], "from step 3 on") || !strings.Contains(warned[0], "no space left") {
		t.Errorf("warnings %q", warned)
	}
	want := map[string]float64{"loss": 2, "learning_rate": 0.1, "global_norm": 2, "examples_per_sec": 30, "train_accuracy": 0.5}
	if !maps.Equal(w.values[1], want) {
		t.Errorf("step 2 wrote %v, want %v", w.values[1], want)
	}

	warned = nil
	w = &failingWriter{closeErr: errors.New("sync: input/output error")}
	s = newSummaries(w, collect(&warned))
	s.write(1, 1, 1, 1, 1, 1)
	s.close()
	if len(warned) != 1 || !strings.Contains(warned[0], "could not be completed") || !strings.Contains(warned[0], "input/output error") {
		t.Errorf("close failure: warnings %q", warned)
	}

	// The real writer on a file that closes cleanly: no warning, and the steps are in it.
	warned = nil
	ev, err := summary.Create(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	s = newSummaries(ev, collect(&warned))
	s.write(1, 1, 1, 1, 1, 1)
	s.close()
	st, err := os.Stat(ev.Path())
	if len(warned) != 0 || err != nil || st.Size() == 0 {
		t.Errorf("clean close: warnings %q, %v", warned, err)
	}
}
