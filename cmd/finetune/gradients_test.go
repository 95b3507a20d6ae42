package main

import (
	"fmt"
	"math"
	"path/filepath"
	"strings"
	"testing"

	"github.com/gorovod/gorovod/bertgraph"
	"github.com/gorovod/gorovod/bertgraph/features"
	"github.com/gorovod/gorovod/bertgraph/tfrecord"
	"github.com/gorovod/gorovod/tf/testenv"
)

// With the NCCL backend the gradients live in its pinned host memory (horovod's AllocHost),
// which the allreduce reduces in place. Over nccl/testdata's fake CUDA runtime and NCCL (one
// "GPU"), a one-rank run on NCCL (where the fake's allreduce in place leaves the gradients as they
// are, as a real one-rank sum does) must say so on rank 0 and train to exactly the variables and
// losses of the same run on MPI (at one rank horovod's local backend), whose gradients are in Go memory.
func TestGradientsInNCCLPinnedMemory(t *testing.T) {
	model := tinyModel(t, false)
	data := t.TempDir()
	writeData(t, data, 24, 4, 4)
	fakeCUDARuntime(t)
	t.Setenv("FAKE_CUDA_DEVICES", "1")
	t.Setenv("GOROVOD_NCCL_LIBRARY", fakeLibrary(t, "libnccl.so", "-DFAKE_NCCL"))
	common := []string{"--do_train", "--num_train_epochs=1", "--train_batch_size=8", "--learning_rate=2e-3", "--warmup_proportion=0",
		"--shuffle_buffer=0", "--save_checkpoints_steps=0", "--export_dir=none", "--seed=3"}
	const logged = "finetune: gradients in the nccl backend's pinned host memory"
	var runs []string
	// --allreduce_backend=mpi on one rank runs horovod's local backend, in Go memory too.
	for _, b := range []struct{ flag, backend string }{{"mpi", "local"}, {"nccl", "nccl"}} {
		dir := filepath.Join(t.TempDir(), b.flag)
		out := mustSucceed(t, mpirun(t, 1, tinyFlags(model, data, dir, append(common, "--allreduce_backend="+b.flag)...)...))
		if !strings.Contains(out, "1 rank(s), "+b.backend+" backend") || strings.Contains(out, logged) != (b.flag == "nccl") {
			t.Fatalf("--allreduce_backend=%s: want the %s backend, and %q logged only on NCCL:\n%s", b.flag, b.backend, logged, out)
		}
		runs = append(runs, dir)
	}
	got := diffRuns(t, runs...)
	if got[0].Steps != 3 || got[0].Variables < 3*40 {
		t.Fatalf("compared %d steps and %d variables, want 3 steps and every variable with its slots", got[0].Steps, got[0].Variables)
	}
	// Bit for bit: both runs are one rank with the same flags, batches and threads, so TensorFlow
	// computes the same; only where the gradients live differs (and a one-rank sum is the identity).
	if got[0].MaxLossDiff != 0 || got[0].MaxWeightDiff != 0 {
		t.Errorf("NCCL with the gradients in pinned memory differs from MPI: losses by %g, variables by %g (want identical)", got[0].MaxLossDiff, got[0].MaxWeightDiff)
	}
}

// With more than one rank the word embeddings' gradient travels as the rows the batches looked
// up (allgathered, then added into the dense gradient); --sparse_as_dense allreduces it whole.
// Both must train alike, to the bit at 2 ranks: the ranks compute the same in both runs, the
// rows nobody looked up are zero either way, and each looked-up row ends as rank 0's value plus
// rank 1's (two addends: the same sum in any order), as the dense allreduce's sum is.
func TestWordEmbeddingRowsTrainAsTheDenseAllreduce(t *testing.T) {
	model := tinyModel(t, false)
	data := t.TempDir()
	writeData(t, data, 24, 4, 4)
	common := []string{"--do_train", "--num_train_epochs=1", "--train_batch_size=4", "--learning_rate=2e-3", "--warmup_proportion=0",
		"--shuffle_buffer=0", "--save_checkpoints_steps=0", "--export_dir=none", "--seed=3"}
	const rows = "the word embeddings' gradient"
	var runs []string
	for _, dense := range []bool{false, true} {
		dir := filepath.Join(t.TempDir(), fmt.Sprint("dense-", dense))
		out := mustSucceed(t, mpirun(t, 2, tinyFlags(model, data, dir, append(common, fmt.Sprint("--sparse_as_dense=", dense))...)...))
		if strings.Contains(out, rows) == dense {
			t.Fatalf("--sparse_as_dense=%v: want %q logged only without it:\n%s", dense, rows, out)
		}
		runs = append(runs, dir)
	}
	got := diffRuns(t, runs...)[0]
	if got.Steps != 3 || got.MaxLossDiff != 0 || got.MaxWeightDiff != 0 {
		t.Errorf("rows against the dense allreduce over %d steps: losses differ by %g, variables by %g (want 3 steps, identical)",
			got.Steps, got.MaxLossDiff, got.MaxWeightDiff)
	}
}

// --use_adasum on 2 ranks applies, every step, the Adasum of the ranks' gradients, tensor by
// tensor (Horovod's formula, its 1e-8 floor on the squared norms), at the flag's learning rate
// unscaled, the word embeddings' gradient dense with the others. The same steps done here by
// hand from each rank's train.tf_record, with the Adasum computed in float64, must end within
// 1e-5 of the run's checkpoint: measured equal, but the run sums its dot products in another
// order (in blocks, by its AVX kernels where the CPU has them), so equality is not asserted.
// The same steps with the ranks' mean gradient instead, at the same learning rate, must end
// farther than 10x that: the check tells Adasum from Average.
func TestAdasumAppliesTheAdasumOfTheRanksGradients(t *testing.T) {
	const steps, batch, lr, seed = 3, 4, 2e-3, 3
	model := tinyModel(t, false)
	data := t.TempDir()
	writeData(t, data, 2*batch*steps, 4, 4)
	dir := filepath.Join(t.TempDir(), "adasum")
	out := mustSucceed(t, mpirun(t, 2, tinyFlags(model, data, dir, "--do_train", "--num_train_epochs=1",
		fmt.Sprintf("--train_batch_size=%d", batch), fmt.Sprintf("--learning_rate=%g", lr), "--warmup_proportion=0",
		"--shuffle_buffer=0", "--save_checkpoints_steps=0", "--export_dir=none", fmt.Sprintf("--seed=%d", seed), "--use_adasum")...))
	for _, want := range []string{"Adasum combines the gradients, the word embeddings' dense with the others", fmt.Sprintf("steps = %d,", steps),
		fmt.Sprintf("peak learning rate = %g\n", lr)} {
		if !strings.Contains(out, want) {
			t.Fatalf("the log does not say %q:\n%s", want, out)
		}
	}
	if strings.Contains(out, "travels as the rows") {
		t.Fatalf("the word embeddings' rows travel apart under Adasum:\n%s", out)
	}
	trained := loadTiny(t, model)
	if err := trained.Restore(filepath.Join(dir, fmt.Sprintf("model.ckpt-%d", steps))); err != nil {
		t.Fatal(err)
	}
	got := trained.NewFlatTensors()
	if err := trained.ReadVariables(got); err != nil {
		t.Fatal(err)
	}
	shards := []string{filepath.Join(dir, "train.tf_record"), filepath.Join(dir, "1", "train.tf_record")}
	adasum := trainTwoRanksByHand(t, model, shards, steps, batch, lr, seed, adasumReference)
	mean := trainTwoRanksByHand(t, model, shards, steps, batch, lr, seed, func(out, a, b []float32) {
		for k := range out {
			out[k] = (a[k] + b[k]) / 2
		}
	})
	vars := trained.Variables()
	maxDiff := func(want *bertgraph.FlatTensors) (float64, string) {
		worst, where := 0.0, ""
		for i, v := range vars {
			for k := range got.Parts[i] {
				if d := math.Abs(float64(got.Parts[i][k] - want.Parts[i][k])); d > worst || math.IsNaN(d) {
					worst, where = d, v.Name
				}
			}
		}
		return worst, where
	}
	const bound = 1e-5
	d, where := maxDiff(adasum)
	t.Logf("largest difference from the Adasum done by hand: %g (%s)", d, where)
	if !(d <= bound) {
		t.Errorf("the run's weights differ from %d steps of Adasum done by hand by %g in %s (bound %g; %s)", steps, d, where, bound, testenv.CPU())
	}
	d, where = maxDiff(mean)
	t.Logf("largest difference from the mean gradient applied by hand: %g (%s)", d, where)
	if !(d > 10*bound) {
		t.Errorf("the run's weights are within %g of the ranks' mean gradient applied (%s): the check cannot tell Adasum from Average", d, where)
	}
}

// adasumReference writes into out Horovod's Adasum of two ranks' gradients a and b, computed
// in float64: a·(1 - a·b/2|a|²) + b·(1 - a·b/2|b|²), a coefficient 1 where its squared norm is
// under 1e-8.
func adasumReference(out, a, b []float32) {
	var dot, aa, bb float64
	for k := range a {
		x, y := float64(a[k]), float64(b[k])
		dot, aa, bb = dot+x*y, aa+x*x, bb+y*y
	}
	ca, cb := 1.0, 1.0
	if aa >= 1e-8 {
		ca = 1 - dot/aa/2
	}
	if bb >= 1e-8 {
		cb = 1 - dot/bb/2
	}
	for k := range out {
		out[k] = float32(ca*float64(a[k]) + cb*float64(b[k]))
	}
}

// trainTwoRanksByHand trains a fresh copy of the tiny model as two ranks would, one process
// computing both: each step, rank r's gradient on the next batch of shards[r] (dropout seed
// (seed+r, step)), the two combined tensor by tensor by combine, applied at the learning rate
// of a run without warmup (lr decaying linearly to zero over steps), clip norm 1, gradient
// scale 1. It returns the weights.
func trainTwoRanksByHand(t *testing.T, model string, shards []string, steps, batchSize int, lr float64, seed int64, combine func(out, a, b []float32)) *bertgraph.FlatTensors {
	t.Helper()
	m := loadTiny(t, model)
	grads := []*bertgraph.FlatTensors{m.NewFlatTensors(), m.NewFlatTensors()}
	combined := m.NewFlatTensors()
	batch := features.NewBatch(batchSize, m.MaxSeqLength())
	var data []*tfrecord.Dataset
	for _, path := range shards {
		ds, err := tfrecord.OpenDataset([]string{path}, tfrecord.DatasetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { ds.Close() })
		data = append(data, ds)
	}
	for step := range int64(steps) {
		for r, ds := range data {
			if err := ds.ReadBatch(batch, true); err != nil {
				t.Fatal(err)
			}
			if _, err := m.TrainStep(batch, bertgraph.DropoutSeed{seed + int64(r), step}, grads[r]); err != nil {
				t.Fatal(err)
			}
		}
		for i := range combined.Parts {
			combine(combined.Parts[i], grads[0].Parts[i], grads[1].Parts[i])
		}
		rate := lr * (1 - float64(step)/float64(steps))
		if _, err := m.Apply(combined, 1, float32(rate), 1); err != nil {
			t.Fatal(err)
		}
	}
	weights := m.NewFlatTensors()
	if err := m.ReadVariables(weights); err != nil {
		t.Fatal(err)
	}
	return weights
}

// loadTiny loads the SavedModel at dir, closed when the test ends.
func loadTiny(t *testing.T, dir string) *bertgraph.Model {
	t.Helper()
	m, err := bertgraph.Load(dir, bertgraph.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { m.Close() })
	return m
}
