package main

import (
	"encoding/json"
	"fmt"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/gorovod/gorovod/tf/testenv"
)

// compareRuns has TensorFlow read the runs' event files and final checkpoints and reports, for
// each run against the first, the largest difference of the per-step loss and of any saved
// variable (model weights, Adam slots, global step), and the mean difference over the model's
// weights (every value of every variable but the slots).
const compareRuns = `
import json, sys
import numpy as np
import tensorflow as tf

def load(d):
    losses = {}
    for f in sorted(tf.io.gfile.glob(d + "/events.out.tfevents.*")):
        for e in tf.compat.v1.train.summary_iterator(f):
            for v in e.summary.value:
                if v.tag == "loss":
                    losses[e.step] = v.simple_value
    r = tf.train.load_checkpoint(d)
    # Every variable and its Adam slots (<name>/adam_m, <name>/adam_v): all but global_step.
    weights = {k: r.get_tensor(k) for k in r.get_variable_to_shape_map() if k != "global_step"}
    return losses, weights

ref_losses, ref_weights = load(sys.argv[1])
out = []
for d in sys.argv[2:]:
    losses, weights = load(d)
    assert sorted(losses) == sorted(ref_losses), (sorted(losses), sorted(ref_losses))
    assert sorted(weights) == sorted(ref_weights)
    out.append({
        "steps": len(losses),
        "max_loss_diff": max(abs(losses[s] - ref_losses[s]) for s in losses),
        "max_weight_diff": max(float(np.max(np.abs(weights[k].astype(np.float64) - ref_weights[k]))) for k in weights),
        "mean_weight_diff": float(np.mean(np.concatenate([
            np.abs(weights[k].astype(np.float64) - ref_weights[k]).ravel()
            for k in weights if not k.endswith(("/adam_m", "/adam_v"))]))),
        "variables": len(weights),
    })
print(json.dumps(out))
`

// The equivalence runs: equivalenceSteps steps of equivalenceBatch examples per rank on 2 ranks,
// of twice that on 1 rank.
const equivalenceBatch, equivalenceSteps = 4, 6

// equivalenceRunner exports the tiny model without dropout and writes the data once; the function
// it returns trains it on 1 or 2 ranks (batch and learning rate chosen for that size, with extra
// flags) into a new output directory named name and returns the directory and the log.
func equivalenceRunner(t *testing.T) func(ranks int, name string, extra ...string) (string, string) {
	model := tinyModel(t, false)
	data := t.TempDir()
	writeData(t, data, 2*equivalenceBatch*equivalenceSteps, 8, 8)
	common := []string{"--do_train", "--num_train_epochs=1", "--warmup_proportion=0", "--shuffle_buffer=0",
		"--save_checkpoints_steps=0", "--export_dir=none", "--seed=3"}
	return func(ranks int, name string, extra ...string) (string, string) {
		// 1 rank x 2b at learning rate 2e-3 is 2 ranks x b at 1e-3 (the schedule scales it by 2).
		flags := []string{fmt.Sprintf("--train_batch_size=%d", 2*equivalenceBatch/ranks), fmt.Sprintf("--learning_rate=%g", 2e-3/float64(ranks))}
		dir := filepath.Join(t.TempDir(), name)
		log := mustSucceed(t, mpirun(t, ranks, tinyFlags(model, data, dir, slices.Concat(common, flags, extra)...)...))
		return dir, log
	}
}

// runDiff is what compareRuns reports for one run against the first.
type runDiff struct {
	Steps          int     `json:"steps"`
	MaxLossDiff    float64 `json:"max_loss_diff"`
	MaxWeightDiff  float64 `json:"max_weight_diff"`
	MeanWeightDiff float64 `json:"mean_weight_diff"`
	Variables      int     `json:"variables"`
}

// diffRuns runs compareRuns over the output directories: one runDiff per run after the first.
func diffRuns(t *testing.T, dirs ...string) []runDiff {
	t.Helper()
	var got []runDiff
	if err := json.Unmarshal(testenv.Python(t, compareRuns, dirs...), &got); err != nil {
		t.Fatal(err)
	}
	return got
}

// With dropout off, N steps on 2 ranks with batch b are the same computation as N steps on 1
// rank with batch 2b over the same examples: each step's union of the ranks' batches is the
// single rank's batch (line i goes to rank i % 2, file order kept), the average of the ranks'
// mean gradients is the mean gradient of the union, and the learning rate the 2-rank run gives
// (scaled by its size) is the 1-rank one. Losses and every saved variable must agree within 1e-5
// with an fp32 allreduce; with fp16 compression within the bound documented in README.
func TestTwoRanksEqualOneRankWithDoubleBatch(t *testing.T) {
	const b, steps = equivalenceBatch, equivalenceSteps
	train := equivalenceRunner(t)
	one, log := train(1, "one")
	// Rank 0 says where its steps went, the first left out.
	if want := fmt.Sprintf("a step after the first, on rank 0 (mean of %d): train_step ", steps-1); !strings.Contains(log, want) {
		t.Errorf("the log does not say %q:\n%s", want, log)
	}
	runs := []string{one}
	for _, fp16 := range []string{"false", "true"} {
		dir, _ := train(2, "two-fp16-"+fp16, "--use_fp16="+fp16)
		runs = append(runs, dir)
	}
	got := diffRuns(t, runs...)
	fp32, fp16 := got[0], got[1]
	t.Logf("fp32 allreduce: %+v", fp32)
	t.Logf("fp16 allreduce: %+v", fp16)
	if fp32.Steps != steps || fp32.Variables < 3*40 {
		t.Fatalf("compared %d steps and %d variables, want %d steps and every variable with its slots", fp32.Steps, fp32.Variables, steps)
	}
	if fp32.MaxLossDiff > 1e-5 || fp32.MaxWeightDiff > 1e-5 {
		t.Errorf("fp32: 2 ranks x batch %d differ from 1 rank x batch %d: loss by %g, weights by %g (bound 1e-5; the batch shapes differ, so rounding depends on the %s)",
			b, 2*b, fp32.MaxLossDiff, fp32.MaxWeightDiff, testenv.CPU())
	}
	// fp16 rounds each gradient to 11 significant bits (relative error 2^-11). Adam's update
	// m/sqrt(v) does not shrink with the gradient: where one is near zero the rounding can flip
	// its sign and move that weight by several learning rates (see the mixed-precision test
	// below), so the bound is on the mean difference over every weight, as there: within steps x
	// peak learning rate x fp16MeanWeightFraction (6e-5; measured 6.3e-6, largest 1.6e-4, on
	// AMX; 1.5e-3 when the 2-rank run's learning rate was 25% low). The loss within fp16LossBound.
	if bound := steps * 2e-3 * fp16MeanWeightFraction; fp16.MaxLossDiff > fp16LossBound || fp16.MeanWeightDiff > bound {
		t.Errorf("fp16: loss differs by %g (bound %g), weights by %g on average (bound %g; largest %g; %s)",
			fp16.MaxLossDiff, fp16LossBound, fp16.MeanWeightDiff, bound, fp16.MaxWeightDiff, testenv.CPU())
	}
	if fp16.MaxWeightDiff == 0 {
		t.Errorf("fp16 compression changed nothing: is it applied?")
	}
}

// With dropout off, --num_accumulation_steps=a trains as a batch a times as large: each step
// applies the mean gradient of the a batches, at the learning rate of the global batch's
// schedule. 1 rank x 2b against 1 rank x b accumulated twice (the rank's two batches are the
// 2b examples in file order) and against 2 ranks x b/2 accumulated twice (with the ranks'
// shards, the same 2b examples per step). Losses and every saved variable within 1e-5, as
// TestTwoRanksEqualOneRankWithDoubleBatch's (the batch shapes differ, so the rounding does);
// the step count is the schedule's for the global batch.
func TestAccumulatedBatchesTrainAsOneBatchAsLarge(t *testing.T) {
	const b, steps = equivalenceBatch, equivalenceSteps
	train := equivalenceRunner(t)
	one, _ := train(1, "one")
	runs := []string{one}
	for _, ranks := range []int{1, 2} {
		dir, log := train(ranks, fmt.Sprintf("accumulated-%d", ranks), fmt.Sprintf("--train_batch_size=%d", b/ranks), "--num_accumulation_steps=2")
		if want := fmt.Sprintf("batch = %d per rank x 2 accumulated x %d ranks, steps = %d,", b/ranks, ranks, steps); !strings.Contains(log, want) {
			t.Fatalf("the log does not say %q:\n%s", want, log)
		}
		runs = append(runs, dir)
	}
	for i, got := range diffRuns(t, runs...) {
		t.Logf("%d rank(s), 2 batches accumulated: %+v", i+1, got)
		if got.Steps != steps || got.Variables < 3*40 {
			t.Fatalf("compared %d steps and %d variables, want %d steps and every variable with its slots", got.Steps, got.Variables, steps)
		}
		if got.MaxLossDiff > 1e-5 || got.MaxWeightDiff > 1e-5 {
			t.Errorf("%d rank(s) x 2 accumulated batches differ from 1 rank x batch %d: loss by %g, weights by %g (bound 1e-5; %s)",
				i+1, 2*b, got.MaxLossDiff, got.MaxWeightDiff, testenv.CPU())
		}
	}
}

const (
	fp16LossBound          = 1e-3
	fp16MeanWeightFraction = 0.005
)

// The same equivalence in mixed precision (forced: this must hold on any CPU): 1 rank x 2b
// against 2 ranks x b, both with --amp=bf16 (and both with --amp=fp16, loss-scaled). The ranks'
// products round to 8 (bfloat16) or 11 (float16) significant bits over b rows instead of 2b
// (a weight gradient is one product over the batch), so unlike float32 the two sides differ by
// that rounding, and by how the CPU's kernels block a product of that shape (oneDNN's AMX
// bfloat16 kernels differ from the float32 emulation a CPU without them runs). Adam's update
// m/sqrt(v) does not shrink with the gradient: where a gradient is near zero the rounding can
// flip its sign, and without bias correction a weight moves by up to 3-6 learning rates a step
// in the first steps, so the largest difference over all values says little (measured 3.3e-3
// on AVX2, 7.7e-3 on AMX, in a pooler kernel and LayerNorm gammas, over 6 steps at 2e-3). The
// bounds (docs/mixed-precision.md): the loss within ampLossBound, and the mean difference over
// every weight within steps x peak learning rate x ampMeanWeightFraction (2.4e-4; measured on AMX
// 5.6e-5 with bfloat16, 2.3e-6 with float16, and 1.5e-3 for either when the 2-rank run's
// learning rate was 25% low). Every rank takes the same loss-scale decisions (float16):
// the runs' skipped steps, if any, would differ in the losses TensorBoard got, which are
// compared step by step.
func TestTwoRanksEqualOneRankWithDoubleBatchMixedPrecision(t *testing.T) {
	const b, steps = equivalenceBatch, equivalenceSteps
	train := equivalenceRunner(t)
	var oneRank []string
	for _, amp := range []string{"bf16", "fp16"} {
		one, log := train(1, "one-"+amp, "--amp="+amp)
		two, _ := train(2, "two-"+amp, "--amp="+amp)
		name := map[string]string{"bf16": "bfloat16", "fp16": "float16"}[amp]
		if want := "precision: " + name + " matrix products (--amp=" + name + " forced; CPU: "; !strings.Contains(log, want) {
			t.Errorf("the log does not say %q:\n%s", want, log)
		}
		oneRank = append(oneRank, one)
		ranks := diffRuns(t, one, two)[0]
		t.Logf("--amp=%s: 2 ranks vs 1 rank %+v", amp, ranks)
		if ranks.Steps != steps || ranks.Variables < 3*40 {
			t.Fatalf("compared %d steps and %d variables, want %d steps and every variable with its slots", ranks.Steps, ranks.Variables, steps)
		}
		if bound := steps * 2e-3 * ampMeanWeightFraction; ranks.MaxLossDiff > ampLossBound || ranks.MeanWeightDiff > bound {
			t.Errorf("--amp=%s: 2 ranks x batch %d differ from 1 rank x batch %d: loss by %g (bound %g), weights by %g on average (bound %g; largest %g; %s)",
				amp, b, 2*b, ranks.MaxLossDiff, ampLossBound, ranks.MeanWeightDiff, bound, ranks.MaxWeightDiff, testenv.CPU())
		}
	}
	// The two precisions really train differently (the mixed signatures are driven; float32's
	// own equivalence is the test above, and bertgraph's tests compare each with float32).
	if d := diffRuns(t, oneRank...)[0]; d.MaxWeightDiff == 0 {
		t.Errorf("--amp=bf16 and --amp=fp16 trained exactly alike: are the mixed signatures driven?")
	}
}

const (
	ampLossBound          = 1e-2
	ampMeanWeightFraction = 0.02
)
