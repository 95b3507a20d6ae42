// Package progress reports training progress on rank 0: a progress bar redrawn in place when the
// output is a terminal, plain log lines every log_step_count_steps otherwise (files, CI logs,
// mpirun's forwarded output), in the spirit of Estimator's `loss = ..., step = ...` lines.
package progress

import (
	"fmt"
	"io"
	"strings"
	"sync"
	"time"

	"github.com/gorovod/gorovod/bertgraph/trainer"
)

// Reporter writes the progress of one training run. Its methods are safe for concurrent use, so
// that other log output can go through Logf without tearing the bar.
type Reporter struct {
	mu        sync.Mutex
	w         io.Writer
	terminal  bool
	width     int
	total     int64
	every     int64
	now       func() time.Time
	start     time.Time
	first     int64 // step at which this run started (non-zero after a resume)
	step      int64 // global step of the last step reported, first before any
	last      time.Time
	rate      float64 // smoothed examples per second, all ranks together
	stepRate  float64 // smoothed steps per second
	barActive bool
	// After the first step (which pays for graph optimisation and warm caches): its end time
	// and the examples processed since, for the steady rate of the summary.
	firstDone     time.Time
	steadyExample int64
	reported      int64 // steps reported so far, this one included
}

// New returns a reporter for a run that goes from step first to step total. terminal selects the
// redrawn bar (width columns); otherwise a line is written every logEvery steps.
func New(w io.Writer, terminal bool, width int, first, total int64, logEvery int) *Reporter {
	return newReporter(w, terminal, width, first, total, logEvery, time.Now)
}

func newReporter(w io.Writer, terminal bool, width int, first, total int64, logEvery int, now func() time.Time) *Reporter {
	if width < 40 {
		width = 80
	}
	if logEvery < 1 {
		logEvery = 1
	}
	t := now()
	return &Reporter{w: w, terminal: terminal, width: width, total: total, every: int64(logEvery),
		now: now, start: t, last: t, first: first, step: first}
}

// smoothing weighs the newest step in the moving averages of the rates.
const smoothing = 0.1

// Report records a finished step and updates the display. A skipped update (gradients not
// finite) leaves the global step where it was and is not a step here: the trainer logs the skip,
// and the next step that applies shows the count (skipped = N) and is timed from the last step
// that applied, so that the rates count the steps and examples that trained, as Estimator's
// global_step/sec does. Taken as a step, it would repeat that step's line.
func (r *Reporter) Report(s trainer.Step) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if s.Step <= r.step {
		return
	}
	r.step = s.Step
	t := r.now()
	dt := t.Sub(r.last).Seconds()
	r.last = t
	r.reported++
	if r.firstDone.IsZero() {
		r.firstDone = t
	} else {
		r.steadyExample += int64(s.Examples)
	}
	if dt > 0 {
		ex, st := float64(s.Examples)/dt, 1/dt
		// The first step's interval holds the set-up and warm-up since New: it stands in until
		// the second, which starts the averages afresh (otherwise they would climb from it for
		// tens of steps, in the log, the ETA and TensorBoard's examples_per_sec).
		if r.rate == 0 || r.reported == 2 {
			r.rate, r.stepRate = ex, st
		} else {
			r.rate += smoothing * (ex - r.rate)
			r.stepRate += smoothing * (st - r.stepRate)
		}
	}
	if r.terminal {
		r.drawBar(s)
		return
	}
	if s.Step%r.every == 0 || s.Step == r.total {
		fmt.Fprintf(r.w, "step %d/%d: loss = %.5f, learning_rate = %.4g, examples/sec = %.1f, global_step/sec = %.3g, eta = %s%s\n",
			s.Step, r.total, s.Loss, s.LR, r.rate, r.stepRate, r.eta(s.Step), skipped(s.Skipped))
	}
}

func (r *Reporter) eta(step int64) string {
	if r.stepRate <= 0 || step >= r.total {
		return "0s"
	}
	d := time.Duration(float64(r.total-step) / r.stepRate * float64(time.Second))
	return d.Round(time.Second).String()
}

func skipped(n int64) string {
	if n == 0 {
		return ""
	}
	return fmt.Sprintf(", skipped = %d", n)
}

func (r *Reporter) drawBar(s trainer.Step) {
	info := fmt.Sprintf(" %d/%d loss %.4f lr %.2e %.1f ex/s ETA %s%s", s.Step, r.total, s.Loss, s.LR, r.rate,
		r.eta(s.Step), skipped(s.Skipped))
	barWidth := r.width - len(info) - 3
	if barWidth < 10 {
		barWidth = 10
	}
	done := 0
	if r.total > 0 {
		done = int(float64(barWidth) * float64(s.Step) / float64(r.total))
	}
	done = min(max(done, 0), barWidth)
	fmt.Fprintf(r.w, "\r[%s%s]%s\x1b[K", strings.Repeat("=", done), strings.Repeat(" ", barWidth-done), info)
	r.barActive = true
}

// Rate is the smoothed rate in examples per second, all ranks together.
func (r *Reporter) Rate() float64 {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.rate
}

// Logf writes one log line, moving an active bar out of the way first. The line goes out in one
// write: mpirun --tag-output tags each piece of a rank's output it reads, so a newline written
// apart could come out as a tag of its own, and another writer's output could land between.
func (r *Reporter) Logf(format string, args ...any) {
	r.mu.Lock()
	defer r.mu.Unlock()
	line := r.clearBar() + fmt.Sprintf(format, args...)
	if !strings.HasSuffix(line, "\n") {
		line += "\n"
	}
	io.WriteString(r.w, line)
}

// Done ends the display with a summary line: steps, wall time, mean examples per second, and
// the steady rate after the first step (what benchmarks compare). The steady rate ends with the
// last step reported: the final checkpoint, written between it and Done, is not a training step
// (MiniLM's with its Adam slots takes seconds, which in a benchmark of ten one-second steps
// would weigh more on the faster side).
func (r *Reporter) Done(step int64, examples int64) {
	r.mu.Lock()
	defer r.mu.Unlock()
	moveBar := r.clearBar()
	t := r.now()
	el := t.Sub(r.start)
	rate, steady := 0.0, 0.0
	if el > 0 {
		rate = float64(examples) / el.Seconds()
	}
	if d := r.last.Sub(r.firstDone).Seconds(); !r.firstDone.IsZero() && d > 0 {
		steady = float64(r.steadyExample) / d
	}
	fmt.Fprintf(r.w, "%strained steps %d..%d in %s: %.1f examples/sec over all ranks (%.2f after the first step)\n",
		moveBar, r.first, step, el.Round(time.Millisecond), rate, steady)
}

// clearBar returns what a line written next starts with: a newline under an active bar, which
// leaves it drawn above.
func (r *Reporter) clearBar() string {
	if r.barActive {
		r.barActive = false
		return "\n"
	}
	return ""
}
