package schedule

import (
	"encoding/json"
	"math"
	"strconv"
	"strings"
	"testing"

	"github.com/gorovod/gorovod/tf/testenv"
)

func TestStepsFollowRunClassifierDividedBySize(t *testing.T) {
	for _, c := range []struct {
		examples, batch, size int
		epochs, warmup        float64
		steps, warm           int64
		peak                  float64
	}{
		// run_classifier on one process: int(1000/32*3) = 93, int(93*0.1) = 9.
		{1000, 32, 1, 3, 0.1, 93, 9, 5e-5},
		// Two ranks halve the steps and double the rate.
		{1000, 32, 2, 3, 0.1, 46, 4, 1e-4},
		// The warmup is a proportion of the whole steps, as run_classifier's int(num_train_steps *
		// warmup_proportion): int(93*0.9) = 83, where the fractional 93.75 steps would give 84.
		{1000, 32, 1, 3, 0.9, 93, 83, 5e-5},
		// Fractional epochs and no warmup.
		{500, 8, 4, 0.5, 0, 7, 0, 2e-4},
	} {
		s, err := New(c.examples, c.batch, c.epochs, c.warmup, 5e-5, c.size)
		if err != nil {
			t.Fatal(err)
		}
		if s.TrainSteps != c.steps || s.WarmupSteps != c.warm || math.Abs(s.PeakLR-c.peak) > 1e-15 {
			t.Errorf("%+v: got %+v", c, s)
		}
	}
}

func TestNewRejectsRunsWithoutSteps(t *testing.T) {
	for _, c := range []struct {
		examples, batch, size int
		epochs, warmup, lr    float64
		want                  string
	}{
		{0, 8, 1, 1, 0.1, 1e-5, "0 training examples"},
		{10, 8, 2, 1, 0.1, 1e-5, "less than one step"},
		{100, 8, 1, 0, 0.1, 1e-5, "num_train_epochs"},
		{100, 8, 1, 1, 1.5, 1e-5, "warmup_proportion"},
		{100, 8, 1, 1, 0.1, 0, "learning_rate"},
		{100, 0, 1, 1, 0.1, 1e-5, "batch 0"},
		{200, 8, 1, 1e30, 0.1, 1e-5, "more steps than an int64 counts"}, // used to wrap to "less than one step"
		{200, 8, 1, math.Inf(1), 0.1, 1e-5, "more steps than an int64 counts"},
	} {
		_, err := New(c.examples, c.batch, c.epochs, c.warmup, c.lr, c.size)
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%+v: got %v, want error containing %q", c, err, c.want)
		}
	}
}

// BERT's schedule worked by hand for 10 steps with 4 of warmup at a peak of 1: step/4 while
// warming up, then 1 - step/10 (the decay counts from step 0, not from the end of warmup), 0 from
// the last step on. It holds where TensorFlow, which the test below compares against, is missing.
func TestLearningRateByHand(t *testing.T) {
	s := Schedule{TrainSteps: 10, WarmupSteps: 4, PeakLR: 1}
	for step, want := range map[int64]float64{0: 0, 1: 0.25, 3: 0.75, 4: 0.6, 5: 0.5, 9: 0.1, 10: 0, 12: 0} {
		if got := s.LearningRate(step); math.Abs(got-want) > 1e-15 {
			t.Errorf("step %d: lr %v, want %v", step, got, want)
		}
	}
}

// The rates must equal those of BERT's optimization.create_optimizer as TensorFlow computes them
// (polynomial_decay to zero, then the warmup override), step by step.
func TestLearningRateEqualsBertOptimizationInTensorFlow(t *testing.T) {
	s := Schedule{TrainSteps: 50, WarmupSteps: 7, PeakLR: 3e-5}
	const script = `
import json, sys
import tensorflow as tf
init_lr, steps, warmup = float(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
out = []
for step in range(steps + 3):
    global_step = tf.constant(step, dtype=tf.int64)
    lr = tf.compat.v1.train.polynomial_decay(init_lr, global_step, steps, end_learning_rate=0.0, power=1.0, cycle=False)
    lr = lr() if callable(lr) else lr  # eager mode returns the schedule's closure
    gs = tf.cast(global_step, tf.int32)
    ws = tf.constant(warmup, dtype=tf.int32)
    warm_lr = init_lr * (tf.cast(gs, tf.float32) / tf.cast(ws, tf.float32))
    is_warm = tf.cast(gs < ws, tf.float32)
    lr = (1.0 - is_warm) * tf.cast(lr, tf.float32) + is_warm * warm_lr
    out.append(float(lr.numpy()))
print(json.dumps(out))
`
	out := testenv.Python(t, script, strconv.FormatFloat(s.PeakLR, 'g', -1, 64),
		strconv.FormatInt(s.TrainSteps, 10), strconv.FormatInt(s.WarmupSteps, 10))
	var want []float64
	if err := json.Unmarshal(out, &want); err != nil {
		t.Fatalf("%v: %s", err, out)
	}
	for step, w := range want {
		got := s.LearningRate(int64(step))
		// TensorFlow computes in float32.
		if math.Abs(got-w) > 1e-6*s.PeakLR+1e-12 {
			t.Errorf("step %d: lr %g, TensorFlow %g", step, got, w)
		}
	}
}
