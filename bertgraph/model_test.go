package bertgraph

import (
	"encoding/json"
	"fmt"
	"math"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/gorovod/gorovod/bertgraph/features"
)

func TestTinyBertLearnsSeparableData(t *testing.T) {
	m := loadFixture(t)
	rng := rand.New(rand.NewPCG(1, 2))
	batches := []*features.Batch{separableBatch(rng, 16), separableBatch(rng, 16)}
	grads := m.NewFlatTensors()
	accuracy := func() float64 {
		var s EvalStats
		for _, b := range batches {
			e, err := m.Eval(b)
			if err != nil {
				t.Fatal(err)
			}
			s.Add(e)
		}
		return float64(s.Correct) / float64(s.Examples)
	}
	if a := accuracy(); a == 1 {
		t.Fatalf("accuracy %v before training: the data is too easy to prove anything", a)
	}
	var first, last float32
	for step := range 150 {
		st, err := m.TrainStep(batches[step%2], DropoutSeed{7, int64(step)}, grads)
		if err != nil {
			t.Fatal(err)
		}
		if step == 0 {
			first = st.Loss
		}
		last = st.Loss
		r, err := m.Apply(grads, 1, 1e-3, 1.0)
		if err != nil {
			t.Fatal(err)
		}
		if !r.Applied || r.GlobalStep != int64(step+1) {
			t.Fatalf("step %d: %+v", step, r)
		}
		if step >= 20 && step%10 == 0 && accuracy() == 1 {
			t.Logf("100%% train accuracy after %d steps, loss %.4f -> %.4f", step+1, first, last)
			return
		}
	}
	t.Fatalf("train accuracy %.3f after 150 steps (loss %.4f -> %.4f)", accuracy(), first, last)
}

// stepsFile is drive.py's steps input.
type stepsFile struct {
	LearningRate float32     `json:"learning_rate"`
	ClipNorm     float32     `json:"clip_norm"`
	Steps        []stepInput `json:"steps"`
}

type stepInput struct {
	InputIDs      [][]int32 `json:"input_ids"`
	InputMask     [][]int32 `json:"input_mask"`
	SegmentIDs    [][]int32 `json:"segment_ids"`
	LabelIDs      []int32   `json:"label_ids"`
	IsRealExample []int32   `json:"is_real_example"`
	DropoutSeed   []int64   `json:"dropout_seed"`
	GradientScale float32   `json:"gradient_scale"`
}

func rows(flat []int32, n int) [][]int32 {
	out := make([][]int32, 0, len(flat)/n)
	for i := 0; i < len(flat); i += n {
		out = append(out, flat[i:i+n])
	}
	return out
}

// Go and Python TensorFlow drive the same SavedModel through the same steps; the gradient scale
// varies from step to step (1/3 and 1/2 as an allreduce's deferred 1/size would, 4 to push the
// norm over the clip), so its feed is checked against Python's too.
func TestGoStepsEqualPythonSteps(t *testing.T) {
	m := loadFixture(t)
	rng := rand.New(rand.NewPCG(3, 4))
	spec := stepsFile{LearningRate: 5e-3, ClipNorm: 1.0}
	grads := m.NewFlatTensors()
	var goLosses []float32
	var goNorms []float32
	scales := []float32{1, 1.0 / 3, 4, 0.5}
	for step, gradientScale := range scales {
		b := separableBatch(rng, 8)
		b.SegmentIDs[3] = 1 // a second segment somewhere
		b.IsRealExample[5] = 0
		seed := DropoutSeed{11, int64(step)}
		spec.Steps = append(spec.Steps, stepInput{rows(b.InputIDs, seqLength), rows(b.InputMask, seqLength),
			rows(b.SegmentIDs, seqLength), b.LabelIDs, b.IsRealExample, seed[:], gradientScale})
		st, err := m.TrainStep(b, seed, grads)
		if err != nil {
			t.Fatal(err)
		}
		if st.Examples != 7 {
			t.Errorf("step %d: %d real examples, want 7", step, st.Examples)
		}
		raw := norm(grads.Data)
		r, err := m.Apply(grads, gradientScale, spec.LearningRate, spec.ClipNorm)
		if err != nil {
			t.Fatal(err)
		}
		if want := float64(gradientScale) * raw; math.Abs(float64(r.GlobalNorm)-want) > 1e-5*want {
			t.Errorf("step %d: global norm %v, want %v x %v", step, r.GlobalNorm, gradientScale, raw)
		}
		goLosses = append(goLosses, st.Loss)
		goNorms = append(goNorms, r.GlobalNorm)
	}
	dir := t.TempDir()
	in, _ := json.Marshal(spec)
	if err := os.WriteFile(filepath.Join(dir, "steps.json"), in, 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := python("steps", "--model", fixture.Model, "--input", filepath.Join(dir, "steps.json"), "--out", filepath.Join(dir, "py.json")); err != nil {
		t.Fatal(err)
	}
	var py struct {
		Losses      []float32            `json:"losses"`
		GlobalNorms []float32            `json:"global_norms"`
		GlobalStep  int64                `json:"global_step"`
		Variables   map[string][]float32 `json:"variables"`
	}
	b, err := os.ReadFile(filepath.Join(dir, "py.json"))
	if err == nil {
		err = json.Unmarshal(b, &py)
	}
	if err != nil {
		t.Fatal(err)
	}
	for i := range goLosses {
		if d := math.Abs(float64(goLosses[i] - py.Losses[i])); d > 1e-5 {
			t.Errorf("step %d: loss Go %v Python %v", i, goLosses[i], py.Losses[i])
		}
		if d := math.Abs(float64(goNorms[i]-py.GlobalNorms[i])) / float64(py.GlobalNorms[i]); d > 1e-5 {
			t.Errorf("step %d: global norm Go %v Python %v", i, goNorms[i], py.GlobalNorms[i])
		}
	}
	if goLosses[0] == goLosses[3] {
		t.Errorf("losses did not move: %v", goLosses)
	}
	values := m.NewFlatTensors()
	if err := m.ReadVariables(values); err != nil {
		t.Fatal(err)
	}
	if step, _ := m.GlobalStep(); step != py.GlobalStep || step != 4 {
		t.Errorf("global step Go %d Python %d, want 4", step, py.GlobalStep)
	}
	worst := 0.0
	for i, v := range m.Variables() {
		want := py.Variables[v.Name]
		if len(want) != len(values.Parts[i]) {
			t.Fatalf("%s: Python has %d values, Go %d", v.Name, len(want), len(values.Parts[i]))
		}
		for j := range want {
			worst = max(worst, math.Abs(float64(values.Parts[i][j]-want[j])))
		}
	}
	if worst > 1e-5 {
		t.Errorf("weights differ from Python's by up to %g after 4 steps", worst)
	}
	t.Logf("max weight difference Go vs Python after 4 steps: %g", worst)
}

func norm(xs []float32) float64 {
	s := 0.0
	for _, x := range xs {
		s += float64(x) * float64(x)
	}
	return math.Sqrt(s)
}

func scaled(src *FlatTensors, dst *FlatTensors, k float64) {
	for i, x := range src.Data {
		dst.Data[i] = float32(float64(x) * k)
	}
}

func TestApplyClipsByGlobalNormAndSkipsNonFinite(t *testing.T) {
	rng := rand.New(rand.NewPCG(5, 6))
	batch := separableBatch(rng, 8)
	// Two real gradients: g1 scaled to norm 0.1 (under the clip norm), g2 scaled 1000x over it.
	probe := loadFixture(t)
	raw := probe.NewFlatTensors()
	g1, g2 := probe.NewFlatTensors(), probe.NewFlatTensors()
	if _, err := probe.TrainStep(batch, DropoutSeed{1, 1}, raw); err != nil {
		t.Fatal(err)
	}
	scaled(raw, g1, 0.1/norm(raw.Data))
	if _, err := probe.TrainStep(batch, DropoutSeed{1, 2}, raw); err != nil {
		t.Fatal(err)
	}
	scaled(raw, g2, 1000)
	big := norm(g2.Data)
	g2clipped := probe.NewFlatTensors()
	scaled(g2, g2clipped, 1/big)

	run := func(second *FlatTensors, clip float32) (*FlatTensors, ApplyResult) {
		m := loadFixture(t)
		if _, err := m.Apply(g1, 1, 1e-2, clip); err != nil {
			t.Fatal(err)
		}
		r, err := m.Apply(second, 1, 1e-2, clip)
		if err != nil {
			t.Fatal(err)
		}
		w := m.NewFlatTensors()
		if err := m.ReadVariables(w); err != nil {
			t.Fatal(err)
		}
		return w, r
	}
	clipped, r := run(g2, 1)
	if !r.Applied || math.Abs(float64(r.GlobalNorm)-big)/big > 1e-5 {
		t.Fatalf("apply of 1000x gradients: %+v, want global norm %g", r, big)
	}
	byHand, _ := run(g2clipped, 1)
	unclipped, _ := run(g2, 1e9)
	diff := func(a, b *FlatTensors) float64 {
		d := 0.0
		for i := range a.Data {
			d = max(d, math.Abs(float64(a.Data[i]-b.Data[i])))
		}
		return d
	}
	if d := diff(clipped, byHand); d > 1e-6 {
		t.Errorf("clipped in-graph vs scaled to the clip norm by hand: weights differ by %g", d)
	}
	if d := diff(clipped, unclipped); d < 1e-4 {
		t.Errorf("clipping made no difference (%g): the check cannot tell", d)
	}

	// A NaN anywhere: nothing changes, not even the step or the Adam slots: the next finite
	// step then gives exactly the weights a fresh model gets from that step alone.
	m := loadFixture(t)
	before, after := m.NewFlatTensors(), m.NewFlatTensors()
	if err := m.ReadVariables(before); err != nil {
		t.Fatal(err)
	}
	bad := m.NewFlatTensors()
	copy(bad.Data, g1.Data)
	bad.Parts[7][3] = float32(math.NaN())
	r, err := m.Apply(bad, 1, 1e-2, 1)
	if err != nil {
		t.Fatal(err)
	}
	if r.Applied || r.GlobalStep != 0 || !math.IsNaN(float64(r.GlobalNorm)) {
		t.Errorf("NaN gradient: %+v, want not applied at step 0 with a NaN norm", r)
	}
	if err := m.ReadVariables(after); err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(before.Data, after.Data) {
		t.Error("a skipped update changed the weights")
	}
	if r, err := m.Apply(g1, 1, 1e-2, 1); err != nil || !r.Applied || r.GlobalStep != 1 {
		t.Errorf("finite step after a skipped one: %+v %v", r, err)
	}
	if err := m.ReadVariables(after); err != nil {
		t.Fatal(err)
	}
	fresh := loadFixture(t)
	if _, err := fresh.Apply(g1, 1, 1e-2, 1); err != nil {
		t.Fatal(err)
	}
	want := fresh.NewFlatTensors()
	if err := fresh.ReadVariables(want); err != nil {
		t.Fatal(err)
	}
	// Bit for bit: both models run the same graph on the same gradients, shapes and threads,
	// so the same kernels add in the same order; any difference is state the skip touched.
	if d := diff(after, want); d != 0 {
		t.Errorf("g1 after a skipped NaN step vs g1 on a fresh model: weights differ by %g (the skip touched the optimizer state)", d)
	}
	if slices.Equal(before.Data, want.Data) {
		t.Error("g1 did not change the weights; the comparison proves nothing")
	}
}

// Padding rows (IsRealExample 0), such as fill the last eval batch, must not count: Eval of a
// batch with some equals Eval of its real rows alone. The padding rows keep real-looking
// features and a label, so counting them would change every sum.
func TestEvalIgnoresPaddingRows(t *testing.T) {
	m := loadFixture(t)
	mixed := separableBatch(rand.New(rand.NewPCG(21, 22)), 8)
	padding := []int{1, 4, 5}
	for _, i := range padding {
		mixed.IsRealExample[i] = 0
		mixed.LabelIDs[i] = 1 - mixed.LabelIDs[i] // wrong on purpose: counted, it would add loss
	}
	real := features.NewBatch(mixed.BatchSize-len(padding), seqLength)
	r := 0
	for i := range mixed.BatchSize {
		if slices.Contains(padding, i) {
			continue
		}
		row := mixed.Row(i)
		copy(real.InputIDs[r*seqLength:], row.InputIDs)
		copy(real.InputMask[r*seqLength:], row.InputMask)
		copy(real.SegmentIDs[r*seqLength:], row.SegmentIDs)
		real.LabelIDs[r], real.IsRealExample[r] = row.LabelID, 1
		r++
	}
	got, err := m.Eval(mixed)
	if err != nil {
		t.Fatal(err)
	}
	want, err := m.Eval(real)
	if err != nil {
		t.Fatal(err)
	}
	if got.Examples != real.BatchSize || want.Examples != real.BatchSize {
		t.Errorf("examples: %d with padding, %d alone; want %d", got.Examples, want.Examples, real.BatchSize)
	}
	if got.Correct != want.Correct || math.Abs(got.LossSum-want.LossSum) > 1e-5*want.LossSum || want.LossSum <= 0 {
		t.Errorf("with padding rows %+v, the real rows alone %+v", got, want)
	}
	// All padding: nothing counts.
	clear(mixed.IsRealExample)
	if none, err := m.Eval(mixed); err != nil || none != (EvalStats{}) {
		t.Errorf("a batch of padding rows only: %+v %v, want zero sums", none, err)
	}
}

func TestCheckpointRoundTripIncludesOptimizerState(t *testing.T) {
	rng := rand.New(rand.NewPCG(7, 8))
	b1, b2 := separableBatch(rng, 8), separableBatch(rng, 8)
	a := loadFixture(t)
	grads := a.NewFlatTensors()
	step := func(m *Model, b *features.Batch, s int64) {
		t.Helper()
		if _, err := m.TrainStep(b, DropoutSeed{3, s}, grads); err != nil {
			t.Fatal(err)
		}
		if _, err := m.Apply(grads, 1, 1e-2, 1); err != nil {
			t.Fatal(err)
		}
	}
	step(a, b1, 0)
	step(a, b2, 1)
	prefix := filepath.Join(t.TempDir(), "model.ckpt")
	written, err := a.Save(prefix)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(written + ".index"); err != nil {
		t.Fatalf("Save returned %q: %v", written, err)
	}
	b := loadFixture(t)
	if err := b.Restore(prefix); err != nil {
		t.Fatal(err)
	}
	if s, _ := b.GlobalStep(); s != 2 {
		t.Errorf("restored global step %d, want 2", s)
	}
	ra, rb := a.NewFlatTensors(), b.NewFlatTensors()
	if err := a.ReadVariables(ra); err != nil {
		t.Fatal(err)
	}
	if err := b.ReadVariables(rb); err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(ra.Data, rb.Data) {
		t.Error("the restored variables differ from the saved ones")
	}
	// One more identical step on both: equal only if the Adam slots came back too. Bit for bit:
	// the same graph, batch, shapes and threads on both models give the same rounding.
	step(a, b1, 2)
	step(b, b1, 2)
	wa, wb := a.NewFlatTensors(), b.NewFlatTensors()
	if err := a.ReadVariables(wa); err != nil {
		t.Fatal(err)
	}
	if err := b.ReadVariables(wb); err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(wa.Data, wb.Data) {
		t.Error("restored model diverges from the saved one after one more step")
	}
	fresh := loadFixture(t)
	if err := fresh.Restore(filepath.Join(t.TempDir(), "missing.ckpt")); err == nil || !strings.Contains(err.Error(), "missing.ckpt") {
		t.Errorf("restore of a missing checkpoint: %v", err)
	}
}

// The word embeddings' gradient is nonzero only in the rows the batch looked up (LookedUpRows'
// promise, which the trainer's allgather of those rows rests on), in every precision: every other
// row is exactly zero, and the looked-up rows are not all zero.
func TestWordEmbeddingGradientIsTheLookedUpRows(t *testing.T) {
	for _, p := range []Precision{Float32, BFloat16} {
		m := loadFixtureIn(t, p)
		emb, ok := m.LookedUpRows()
		if !ok || m.Variables()[emb].Name != WordEmbeddings {
			t.Fatalf("LookedUpRows = %d, %v: want the word embeddings", emb, ok)
		}
		batch := separableBatch(newRand(), 8)
		grads := m.NewFlatTensors()
		if _, err := m.TrainStep(batch, DropoutSeed{4, 5}, grads); err != nil {
			t.Fatal(err)
		}
		looked := map[int32]bool{}
		for _, id := range batch.InputIDs {
			looked[id] = true
		}
		width := int(m.Variables()[emb].Shape[1])
		g := grads.Parts[emb]
		nonzero := 0
		for row := range len(g) / width {
			zero := true
			for _, x := range g[row*width : (row+1)*width] {
				zero = zero && x == 0
			}
			if !zero && !looked[int32(row)] {
				t.Fatalf("%v: row %d of the word embeddings' gradient is not zero, and the batch does not look it up", p, row)
			}
			if !zero {
				nonzero++
			}
		}
		if nonzero < len(looked)/2 {
			t.Errorf("%v: %d of the %d looked-up rows have a gradient", p, nonzero, len(looked))
		}
		m.Close()
	}
}

// A clip norm or learning rate out of range is an error before the step: an infinite one would
// turn every weight NaN while the global norm, and so the step, looked finite.
func TestApplyRefusesClipNormsAndLearningRatesOutOfRange(t *testing.T) {
	m := loadFixture(t)
	grads := m.NewFlatTensors()
	inf, nan := float32(math.Inf(1)), float32(math.NaN())
	for _, c := range []struct{ lr, clip float32 }{{1e-3, inf}, {1e-3, 0}, {1e-3, nan}, {inf, 1}, {-1e-3, 1}, {nan, 1}} {
		if r, err := m.Apply(grads, 1, c.lr, c.clip); err == nil || r.Applied {
			t.Errorf("learning rate %v, clip norm %v: %+v, %v; want an error", c.lr, c.clip, r, err)
		}
	}
	if step, err := m.GlobalStep(); err != nil || step != 0 {
		t.Errorf("global step %d, %v after refused steps; want 0", step, err)
	}
	if r, err := m.Apply(grads, 1, 0, 1); err != nil || !r.Applied { // warmup's first rate is 0
		t.Errorf("learning rate 0: %+v, %v", r, err)
	}
}

// Apply feeds gradients whose parts are aligned for TensorFlow where they lie (NewFlatTensors'
// are: BERT's variable sizes are multiples of 16 values, but for the last bias) and copies the
// others: the same gradients one float32 off the alignment, all copied, give bit for bit the
// same weights over two steps, the second after the gradients were changed in place, so a feed
// that read stale or foreign memory would show. Bit for bit: both models run the same graph on
// the same gradient bytes with the same threads in one process, so the same kernels add in the
// same order. Apply must not write into the gradients either.
func TestApplyReadsAlignedGradientsWhereTheyLie(t *testing.T) {
	rng := rand.New(rand.NewPCG(9, 10))
	inPlace, copied := loadFixture(t), loadFixture(t)
	aligned := inPlace.NewFlatTensors()
	if _, err := inPlace.TrainStep(separableBatch(rng, 8), DropoutSeed{2, 0}, aligned); err != nil {
		t.Fatal(err)
	}
	shifted := make([]float32, len(aligned.Data)+1)
	off, err := copied.FlatTensorsOver(shifted[1:])
	if err != nil {
		t.Fatal(err)
	}
	for step := range 2 {
		if step == 1 {
			for i := range aligned.Data {
				aligned.Data[i] *= -0.5
			}
		}
		copy(off.Data, aligned.Data)
		before := slices.Clone(aligned.Data)
		r1, err := inPlace.Apply(aligned, 1, 1e-2, 1)
		if err != nil {
			t.Fatal(err)
		}
		r2, err := copied.Apply(off, 1, 1e-2, 1)
		if err != nil {
			t.Fatal(err)
		}
		lastBias := 4 * len(aligned.Parts[len(aligned.Parts)-1])
		if r1.CopiedBytes > lastBias {
			t.Errorf("step %d: Apply copied %d bytes of NewFlatTensors' gradients, want at most the last bias (%d)", step, r1.CopiedBytes, lastBias)
		}
		if r2.CopiedBytes < 4*len(off.Data)-4*len(off.Data)/16-lastBias {
			t.Errorf("step %d: Apply copied %d of %d bytes of misaligned gradients", step, r2.CopiedBytes, 4*len(off.Data))
		}
		if r1.GlobalNorm != r2.GlobalNorm {
			t.Errorf("step %d: global norm %v in place, %v copied", step, r1.GlobalNorm, r2.GlobalNorm)
		}
		if !slices.Equal(before, aligned.Data) {
			t.Fatalf("step %d: Apply wrote into the gradients", step)
		}
	}
	w1, w2 := inPlace.NewFlatTensors(), copied.NewFlatTensors()
	if err := inPlace.ReadVariables(w1); err != nil {
		t.Fatal(err)
	}
	if err := copied.ReadVariables(w2); err != nil {
		t.Fatal(err)
	}
	for i, v := range inPlace.Variables() {
		if !slices.Equal(w1.Parts[i], w2.Parts[i]) {
			t.Errorf("%s: weights after two steps differ between gradients fed in place and copied", v.Name)
		}
	}
}

// Eval and Predict feed tensors of their own, so goroutines calling them at once each get
// their own batch's results. Compared exactly: the same session runs the same batch shape
// with the same kernels, which split their work by the session's thread count, not by which
// threads happen to be free, so a batch's results do not depend on what runs beside it.
func TestEvalAndPredictRunConcurrently(t *testing.T) {
	m := loadFixture(t)
	rng := rand.New(rand.NewPCG(3, 4))
	const n = 6
	batches := make([]*features.Batch, n)
	wantEval := make([]EvalStats, n)
	wantPred := make([]*Predictions, n)
	for i := range batches {
		batches[i] = separableBatch(rng, 8)
		var err error
		if wantEval[i], err = m.Eval(batches[i]); err != nil {
			t.Fatal(err)
		}
		if wantPred[i], err = m.Predict(batches[i]); err != nil {
			t.Fatal(err)
		}
	}
	if slices.Equal(wantPred[0].Logits, wantPred[1].Logits) {
		t.Fatal("two batches give the same logits: a mix-up could not be seen")
	}
	errs := make(chan error, n)
	for i := range batches {
		go func() {
			errs <- func() error {
				for range 3 {
					e, err := m.Eval(batches[i])
					if err != nil {
						return err
					}
					if e != wantEval[i] {
						return fmt.Errorf("batch %d: concurrent Eval %+v, alone %+v", i, e, wantEval[i])
					}
					p, err := m.Predict(batches[i])
					if err != nil {
						return err
					}
					if !slices.Equal(p.Logits, wantPred[i].Logits) || !slices.Equal(p.Probabilities, wantPred[i].Probabilities) {
						return fmt.Errorf("batch %d: concurrent Predict logits %v, alone %v", i, p.Logits, wantPred[i].Logits)
					}
				}
				return nil
			}()
		}()
	}
	for range batches {
		if err := <-errs; err != nil {
			t.Error(err)
		}
	}
}
