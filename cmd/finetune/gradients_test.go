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
	run := adasumRun(t, "--use_adasum", "Adasum combines the gradients, the word embeddings' dense with the others")
	run.check(t, "the Adasum of the gradients", run.byHand(t, false, adasumReference), "the mean gradient", run.byHand(t, false, mean))
}

// --use_adasum=updates on 2 ranks: every rank takes an AdamWeightDecay step of its own on its
// own gradients, with its own slots, and the weights become those before it plus the Adasum of
// the two changes. The same done here by hand, a model per rank, must end within 1e-5 of the
// run's checkpoint (rank 0's weights), and the Adasum of the gradients (--use_adasum) farther
// than 10x that.
func TestAdasumOfUpdatesAppliesTheAdasumOfTheRanksSteps(t *testing.T) {
	run := adasumRun(t, "--use_adasum=updates", "Adasum combines the ranks' weight updates")
	run.check(t, "the Adasum of the updates", run.byHand(t, true, adasumReference), "the Adasum of the gradients", run.byHand(t, false, adasumReference))
}

// mean writes into out the mean of a and b.
func mean(out, a, b []float32) {
	for k := range out {
		out[k] = (a[k] + b[k]) / 2
	}
}

// adasumTraining is a finished 2-rank run of the tiny model with an Adasum flag.
type adasumTraining struct {
	model  string   // the SavedModel
	shards []string // each rank's train.tf_record
	got    *bertgraph.FlatTensors
	vars   []bertgraph.VariableSpec
}

const adasumSteps, adasumBatch, adasumLR, adasumSeed = 3, 4, 2e-3, 3

// adasumRun trains the tiny model on 2 ranks, 3 steps of 4 examples per rank at learning rate
// 2e-3 (the flag's, unscaled) with flag, checks that the log says logged and that the word
// embeddings' rows do not travel apart, and reads the last checkpoint's weights.
func adasumRun(t *testing.T, flag, logged string) adasumTraining {
	t.Helper()
	model := tinyModel(t, false)
	data := t.TempDir()
	writeData(t, data, 2*adasumBatch*adasumSteps, 4, 4)
	dir := filepath.Join(t.TempDir(), "adasum")
	out := mustSucceed(t, mpirun(t, 2, tinyFlags(model, data, dir, "--do_train", "--num_train_epochs=1",
		fmt.Sprintf("--train_batch_size=%d", adasumBatch), fmt.Sprintf("--learning_rate=%g", adasumLR), "--warmup_proportion=0",
		"--shuffle_buffer=0", "--save_checkpoints_steps=0", "--export_dir=none", fmt.Sprintf("--seed=%d", adasumSeed), flag)...))
	for _, want := range []string{logged, fmt.Sprintf("steps = %d,", adasumSteps), fmt.Sprintf("peak learning rate = %g\n", adasumLR)} {
		if !strings.Contains(out, want) {
			t.Fatalf("the log does not say %q:\n%s", want, out)
		}
	}
	if strings.Contains(out, "travels as the rows") {
		t.Fatalf("the word embeddings' rows travel apart under Adasum:\n%s", out)
	}
	trained := loadTiny(t, model)
	if err := trained.Restore(filepath.Join(dir, fmt.Sprintf("model.ckpt-%d", adasumSteps))); err != nil {
		t.Fatal(err)
	}
	got := trained.NewFlatTensors()
	if err := trained.ReadVariables(got); err != nil {
		t.Fatal(err)
	}
	return adasumTraining{model: model, shards: []string{filepath.Join(dir, "train.tf_record"), filepath.Join(dir, "1", "train.tf_record")},
		got: got, vars: trained.Variables()}
}

// check fails unless the run's weights are within 1e-5 of want's and farther than 10x that from
// other's.
func (r adasumTraining) check(t *testing.T, wantName string, want *bertgraph.FlatTensors, otherName string, other *bertgraph.FlatTensors) {
	t.Helper()
	maxDiff := func(w *bertgraph.FlatTensors) (float64, string) {
		worst, where := 0.0, ""
		for i, v := range r.vars {
			for k := range r.got.Parts[i] {
				if d := math.Abs(float64(r.got.Parts[i][k] - w.Parts[i][k])); d > worst || math.IsNaN(d) {
					worst, where = d, v.Name
				}
			}
		}
		return worst, where
	}
	const bound = 1e-5
	d, where := maxDiff(want)
	t.Logf("largest difference from %s done by hand: %g (%s)", wantName, d, where)
	if !(d <= bound) {
		t.Errorf("the run's weights differ from %d steps of %s done by hand by %g in %s (bound %g; %s)", adasumSteps, wantName, d, where, bound, testenv.CPU())
	}
	d, where = maxDiff(other)
	t.Logf("largest difference from %s done by hand: %g (%s)", otherName, d, where)
	if !(d > 10*bound) {
		t.Errorf("the run's weights are within %g of %s (%s): the check cannot tell them apart", d, otherName, where)
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

// byHand trains fresh copies of the tiny model as the run's two ranks would, in this one
// process: each step, rank r's gradient on the next batch of its shard (dropout seed (seed+r,
// step)), at the learning rate of a run without warmup (decaying linearly to zero over the
// steps), clip norm 1. Without updates, one model applies the two gradients combined tensor by
// tensor by combine (gradient scale 1); with updates, each rank's own model applies its own
// gradient, and both take the weights before plus the two changes combined by combine. It
// returns the weights.
func (r adasumTraining) byHand(t *testing.T, updates bool, combine func(out, a, b []float32)) *bertgraph.FlatTensors {
	t.Helper()
	models := []*bertgraph.Model{loadTiny(t, r.model)}
	if updates {
		models = append(models, loadTiny(t, r.model))
	}
	m := models[0]
	grads := []*bertgraph.FlatTensors{m.NewFlatTensors(), m.NewFlatTensors()}
	before, combined := m.NewFlatTensors(), m.NewFlatTensors()
	batch := features.NewBatch(adasumBatch, m.MaxSeqLength())
	var data []*tfrecord.Dataset
	for _, path := range r.shards {
		ds, err := tfrecord.OpenDataset([]string{path}, tfrecord.DatasetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { ds.Close() })
		data = append(data, ds)
	}
	must := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	for step := range int64(adasumSteps) {
		rate := float32(adasumLR * (1 - float64(step)/adasumSteps))
		for rank, ds := range data {
			must(ds.ReadBatch(batch, true))
			_, err := models[min(rank, len(models)-1)].TrainStep(batch, bertgraph.DropoutSeed{adasumSeed + int64(rank), step}, grads[rank])
			must(err)
		}
		if !updates {
			for i := range combined.Parts {
				combine(combined.Parts[i], grads[0].Parts[i], grads[1].Parts[i])
			}
			_, err := m.Apply(combined, 1, rate, 1)
			must(err)
			continue
		}
		must(m.ReadVariables(before))
		for rank, own := range models { // grads[rank] becomes the rank's change
			_, err := own.Apply(grads[rank], 1, rate, 1)
			must(err)
			must(own.ReadVariables(grads[rank]))
			for k, w := range before.Data {
				grads[rank].Data[k] -= w
			}
		}
		for i := range combined.Parts {
			combine(combined.Parts[i], grads[0].Parts[i], grads[1].Parts[i])
		}
		for k, w := range before.Data {
			combined.Data[k] += w
		}
		for _, own := range models {
			must(own.AssignVariables(combined))
		}
	}
	weights := m.NewFlatTensors()
	must(m.ReadVariables(weights))
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
