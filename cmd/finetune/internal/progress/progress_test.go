package progress

import (
	"bytes"
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
