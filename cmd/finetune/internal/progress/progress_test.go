package progress

import (
	"bytes"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/gorovod/gorovod/bertgraph/trainer"
)

type clock struct{ t time.Time }

func (c *clock) now() time.Time       { return c.t }
func (c *clock) tick(d time.Duration) { c.t = c.t.Add(d) }

func TestPlainLinesEveryNStepsWithRatesAndETA(t *testing.T) {
	var b bytes.Buffer
	c := &clock{t: time.Unix(0, 0)}
	r := newReporter(&b, false, 0, 0, 10, 4, c.now)
	for step := int64(1); step <= 10; step++ {
		c.tick(500 * time.Millisecond) // 2 steps/s, 64 examples per step -> 128 ex/s
		r.Report(trainer.Step{Step: step, Loss: 1 / float64(step), LR: 1e-4, Examples: 64})
	}
	lines := strings.Split(strings.TrimSpace(b.String()), "\n")
	if len(lines) != 3 {
		t.Fatalf("want lines at steps 4, 8 and the last, got:\n%s", b.String())
	}
	want := "step 4/10: loss = 0.25000, learning_rate = 0.0001, examples/sec = 128.0, global_step/sec = 2, eta = 3s"
	if lines[0] != want {
		t.Errorf("got  %q\nwant %q", lines[0], want)
	}
	if !strings.HasPrefix(lines[2], "step 10/10:") || !strings.HasSuffix(lines[2], "eta = 0s") {
		t.Errorf("last line %q", lines[2])
	}
	c.tick(3 * time.Second) // the final checkpoint: in the wall time and the mean, not the steady rate
	r.Done(10, 640)
	if !strings.HasSuffix(b.String(), "trained steps 0..10 in 8s: 80.0 examples/sec over all ranks (128.00 after the first step)\n") {
		t.Errorf("summary: %q", b.String())
	}
}

// The first step's interval, with the set-up and warm-up in it, does not drag the rates: from
// the second step on they are the steady ones.
func TestRatesStartAfterTheFirstStep(t *testing.T) {
	var b bytes.Buffer
	c := &clock{t: time.Unix(0, 0)}
	r := newReporter(&b, false, 0, 0, 10, 1, c.now)
	c.tick(20 * time.Second) // loading, graph optimisation
	r.Report(trainer.Step{Step: 1, Examples: 64})
	for step := int64(2); step <= 4; step++ {
		c.tick(500 * time.Millisecond)
		r.Report(trainer.Step{Step: step, Examples: 64})
		if got := r.Rate(); got != 128 {
			t.Errorf("step %d: rate %v, want 128", step, got)
		}
	}
	if !strings.Contains(b.String(), "step 2/10: loss = 0.00000, learning_rate = 0, examples/sec = 128.0, global_step/sec = 2, eta = 4s") {
		t.Errorf("log:\n%s", b.String())
	}
}

// A skipped update (float16's loss scale overflowing, before the first step and after step 2)
// reports the step it left unchanged: no line of its own, whose step would repeat, and no step
// or examples in the rates; the next line counts it, its rates timed from the last applied step.
func TestSkippedUpdateIsNoStep(t *testing.T) {
	var b bytes.Buffer
	c := &clock{t: time.Unix(0, 0)}
	r := newReporter(&b, false, 0, 0, 10, 1, c.now)
	c.tick(20 * time.Second)
	r.Report(trainer.Step{Step: 0, Examples: 64, Skipped: 1})
	for _, s := range []trainer.Step{{Step: 1, Skipped: 1}, {Step: 2, Skipped: 1}, {Step: 2, Skipped: 2}, {Step: 3, Skipped: 2}} {
		c.tick(500 * time.Millisecond)
		s.Examples = 64
		r.Report(s)
	}
	// Step 3 took 1 s with the skip: 64 examples/s and 1 step/s into the averages of 128 and 2.
	lines := strings.Split(strings.TrimSpace(b.String()), "\n")
	if want := "step 3/10: loss = 0.00000, learning_rate = 0, examples/sec = 121.6, global_step/sec = 1.9, eta = 4s, skipped = 2"; len(lines) != 3 ||
		!strings.HasPrefix(lines[0], "step 1/10:") || !strings.HasPrefix(lines[1], "step 2/10:") || lines[2] != want {
		t.Fatalf("want one line for each of steps 1, 2 and 3, the last\n%s\ngot:\n%s", want, b.String())
	}
	r.Done(3, 3*64)
	if !strings.HasSuffix(b.String(), "trained steps 0..3 in 22s: 8.7 examples/sec over all ranks (85.33 after the first step)\n") {
		t.Errorf("summary: %q", b.String())
	}
}

func TestBarRedrawsInPlaceAndLogsMoveItAside(t *testing.T) {
	var b bytes.Buffer
	c := &clock{t: time.Unix(0, 0)}
	r := newReporter(&b, true, 80, 100, 200, 50, c.now)
	c.tick(time.Second)
	r.Report(trainer.Step{Step: 150, Loss: 0.5, LR: 2e-5, Examples: 32, Skipped: 2})
	out := b.String()
	if !strings.HasPrefix(out, "\r[") || strings.Contains(out, "\n") {
		t.Fatalf("bar not drawn in place: %q", out)
	}
	for _, part := range []string{"150/200", "loss 0.5000", "lr 2.00e-05", "32.0 ex/s", "ETA 50s", "skipped = 2"} {
		if !strings.Contains(out, part) {
			t.Errorf("bar %q lacks %q", out, part)
		}
	}
	bar := out[2:strings.Index(out, "]")]
	if n := strings.Count(bar, "="); n != len(bar)*3/4 || len(out)-len("\r\x1b[K") != 79 { // one column spare: no wrap
		t.Errorf("bar %q: %d of %d filled at step 150 of 200, line %d columns", bar, n, len(bar), len(out))
	}
	r.Logf("saved %s", "model.ckpt-150")
	if !strings.HasSuffix(b.String(), "\x1b[K\nsaved model.ckpt-150\n") {
		t.Errorf("log line did not move the bar aside: %q", b.String())
	}
}

// writes records each Write apart.
type writes []string

func (w *writes) Write(p []byte) (int, error) { *w = append(*w, string(p)); return len(p), nil }

// Every line goes out in one write, with or without a bar to move aside: mpirun --tag-output
// tags each piece of a rank's output it reads, and a newline written apart came out as a tag
// of its own ("saved checkpoint ...[1,0]<stderr>:").
func TestEachLineIsOneWrite(t *testing.T) {
	for _, terminal := range []bool{false, true} {
		var w writes
		c := &clock{t: time.Unix(0, 0)}
		r := newReporter(&w, terminal, 80, 0, 10, 1, c.now)
		c.tick(time.Second)
		r.Report(trainer.Step{Step: 1, Loss: 0.5, LR: 2e-5, Examples: 32})
		r.Logf("saved %s", "model.ckpt-1")
		r.Report(trainer.Step{Step: 2, Loss: 0.5, LR: 2e-5, Examples: 32})
		r.Done(2, 64)
		for _, line := range []string{"saved model.ckpt-1\n", "trained steps 0..2 in "} {
			i := slices.IndexFunc(w, func(s string) bool { return strings.Contains(s, line) })
			if i < 0 || !strings.HasSuffix(w[i], "\n") || (terminal && !strings.HasPrefix(w[i], "\n")) {
				t.Errorf("terminal %v: writes %q: want %q in one write ending its line (after the bar's newline on a terminal)", terminal, w, line)
			}
		}
	}
}
