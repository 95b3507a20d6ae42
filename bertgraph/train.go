package bertgraph

import (
	"fmt"
	"math"
	"unsafe"

	"github.com/gorovod/gorovod/bertgraph/features"
	"github.com/gorovod/gorovod/tf"
)

// StepStats are train_step's scalars for one batch.
type StepStats struct {
	// Loss is the mean cross-entropy over the batch's real examples.
	Loss float32
	// Correct of Examples real examples were classified right (training accuracy, with dropout).
	Correct, Examples int
}

// DropoutSeed seeds train_step's stateless dropout: the same seed gives the same masks in any
// process. Give each rank and each step its own, e.g. {baseSeed + rank, step}.
type DropoutSeed [2]int64

// TrainStep runs train_step on batch and writes one dense gradient per variable into grads
// (allocated once with NewFlatTensors and reused every step). The model's weights do not change:
// Apply does that, with the (averaged) gradients.
func (m *Model) TrainStep(batch *features.Batch, seed DropoutSeed, grads *FlatTensors) (StepStats, error) {
	if err := grads.check(m.contract.Variables); err != nil {
		return StepStats{}, err
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if err := m.inputs.set(batch, m.contract, true); err != nil {
		return StepStats{}, err
	}
	var err error
	if m.inputs.seed, err = reuse(m.inputs.seed, seed[:], 2); err != nil {
		return StepStats{}, err
	}
	s := m.sigs[m.opts.Precision.trainStep()]
	m.inputs.feedInto(s.feeds, s, true)
	s.feed("dropout_seed", m.inputs.seed)
	out, err := s.run(m.sm.Session, s.feeds, m.trainFetches)
	if err != nil {
		return StepStats{}, err
	}
	defer closeAll(out)
	var st StepStats
	if st.Loss, err = scalarValue[float32](out[0], "train_step loss"); err != nil {
		return st, err
	}
	correct, err := scalarValue[int32](out[1], "train_step correct")
	if err != nil {
		return st, err
	}
	examples, err := scalarValue[int32](out[2], "train_step examples")
	if err != nil {
		return st, err
	}
	st.Correct, st.Examples = int(correct), int(examples)
	for i, v := range m.contract.Variables {
		if err := copyOut(out[3+i], grads.Parts[i]); err != nil {
			return st, fmt.Errorf("bertgraph: gradient of %s: %w", v.Name, err)
		}
	}
	return st, nil
}

// WordEmbeddings is the Google BERT name of the vocabulary's embedding table, which the model
// looks its input_ids up in.
const WordEmbeddings = "bert/embeddings/word_embeddings"

// LookedUpRows returns the index among Variables of the word embeddings: the variable whose
// TrainStep gradient is nonzero only in the rows the batch's input_ids name (a lookup's gradient,
// IndexedSlices in TensorFlow, which train_step densifies), every other row exactly zero. ok is
// false for a model without them.
func (m *Model) LookedUpRows() (variable int, ok bool) {
	for i, v := range m.contract.Variables {
		if v.Name == WordEmbeddings && len(v.Shape) == 2 {
			return i, true
		}
	}
	return 0, false
}

// ApplyResult is what apply_gradients reports.
type ApplyResult struct {
	GlobalNorm float32 // of the scaled gradients (gradientScale x grads), before clipping
	GlobalStep int64   // after the step
	// Applied is false when the global norm was not finite: then nothing changed, not even
	// the global step (but a dynamic loss scale was halved).
	Applied bool
	// LossScale is the loss scale after the step: 1 unless the model runs in Float16.
	LossScale float32
	// CopiedBytes is how much of the gradients was copied to be fed: 0 when TensorFlow read
	// every one where it lies (see Apply).
	CopiedBytes int
}

// Apply applies one AdamWeightDecay step with learningRate to gradientScale x grads, clipped to
// clipNorm by global norm. Gradients of a loss-scaled TrainStep are unscaled in the same multiply,
// and the loss scale is updated (see ApplyResult.LossScale). gradientScale is 1 for gradients
// already averaged; an allreduce that sums and leaves the division to this step
// (horovod.Reducer with DeferAverage) passes its GradientScale: the graph folds it into the
// multiply clipping does anyway, so averaging costs no pass over the gradients of its own.
//
// TensorFlow reads each gradient where it lies (tf.NewTensorOver), no copy, when its part
// starts at a tf.TensorAlignment boundary: every part of NewFlatTensors, and of FlatTensorsOver
// a page-aligned buffer, for BERT's variables (each a multiple of 16 values, but for the
// classifier's last bias); other parts are copied (ApplyResult.CopiedBytes). Nothing refers to
// grads once Apply returns, so they may be reused right away.
func (m *Model) Apply(grads *FlatTensors, gradientScale, learningRate, clipNorm float32) (ApplyResult, error) {
	if err := grads.check(m.contract.Variables); err != nil {
		return ApplyResult{}, err
	}
	// An infinite clip norm or learning rate would not fail the step: every weight would turn
	// NaN while the global norm, the guard against non-finite gradients, stays finite.
	if !(clipNorm > 0) || math.IsInf(float64(clipNorm), 1) {
		return ApplyResult{}, fmt.Errorf("bertgraph: clip norm %v is not a positive finite number", clipNorm)
	}
	if !(learningRate >= 0) || math.IsInf(float64(learningRate), 1) {
		return ApplyResult{}, fmt.Errorf("bertgraph: learning rate %v is not a finite number >= 0", learningRate)
	}
	if !(gradientScale > 0) || math.IsInf(float64(gradientScale), 1) {
		return ApplyResult{}, fmt.Errorf("bertgraph: gradient scale %v is not a positive finite number", gradientScale)
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	s := m.sigs[SigApplyGradients]
	if m.grads == nil {
		m.grads = make([]*tf.Tensor, len(m.contract.Variables))
	}
	var r ApplyResult
	views := make([]*tf.Tensor, 0, len(m.contract.Variables))
	defer func() { closeAll(views) }()
	for i, v := range m.contract.Variables {
		part := grads.Parts[i]
		if uintptr(unsafe.Pointer(unsafe.SliceData(part)))%tf.TensorAlignment == 0 {
			t, err := tf.NewTensorOver(part, v.Shape...)
			if err != nil {
				return ApplyResult{}, fmt.Errorf("bertgraph: gradient of %s: %w", v.Name, err)
			}
			views = append(views, t)
			s.feed(v.GradientKey, t)
			continue
		}
		var err error
		if m.grads[i], err = reuse(m.grads[i], part, v.Shape...); err != nil {
			return ApplyResult{}, fmt.Errorf("bertgraph: gradient of %s: %w", v.Name, err)
		}
		r.CopiedBytes += 4 * len(part)
		s.feed(v.GradientKey, m.grads[i])
	}
	var err error
	if m.scalars.scale, err = reuse(m.scalars.scale, []float32{gradientScale}); err != nil {
		return ApplyResult{}, err
	}
	if m.scalars.lr, err = reuse(m.scalars.lr, []float32{learningRate}); err != nil {
		return ApplyResult{}, err
	}
	if m.scalars.clip, err = reuse(m.scalars.clip, []float32{clipNorm}); err != nil {
		return ApplyResult{}, err
	}
	s.feed("gradient_scale", m.scalars.scale)
	s.feed("learning_rate", m.scalars.lr)
	s.feed("clip_norm", m.scalars.clip)
	out, err := s.run(m.sm.Session, s.feeds, m.applyFetches)
	if err != nil {
		return ApplyResult{}, err
	}
	defer closeAll(out)
	if r.GlobalNorm, err = scalarValue[float32](out[0], "apply_gradients global_norm"); err != nil {
		return r, err
	}
	if r.GlobalStep, err = scalarValue[int64](out[1], "apply_gradients global_step"); err != nil {
		return r, err
	}
	if r.Applied, err = scalarValue[bool](out[2], "apply_gradients applied"); err != nil {
		return r, err
	}
	r.LossScale, err = scalarValue[float32](out[3], "apply_gradients loss_scale")
	return r, err
}

// scalarValue reads a one-element tensor.
func scalarValue[T tf.Scalar](t *tf.Tensor, what string) (T, error) {
	var buf [1]T
	v, err := tf.Values(t, buf[:0])
	if err != nil {
		return buf[0], fmt.Errorf("bertgraph: %s: %w", what, err)
	}
	if len(v) != 1 {
		return buf[0], fmt.Errorf("bertgraph: %s has %d values, want 1", what, len(v))
	}
	return v[0], nil
}
