package bertgraph

import (
	"fmt"
	"slices"

	"github.com/gorovod/gorovod/bertgraph/features"
	"github.com/gorovod/gorovod/tf"
)

// FlatTensors holds one float32 tensor per model variable, in the contract's variable order,
// in one contiguous buffer: Parts[i] is a view of Data with variable i's elements (row-major).
// Gradients and variable values travel in it, so a fused allreduce or a broadcast is one call
// over Data. Each view's capacity runs to the end of Data, which is how horovod sees that the
// views lie back to back in one allocation and reduces them in place, without its fusion
// buffer; so never append to a part: it would write into the next variable's values.
type FlatTensors struct {
	Data  []float32
	Parts [][]float32
}

// NewFlatTensors allocates a zeroed FlatTensors shaped like the model's variables.
func (m *Model) NewFlatTensors() *FlatTensors {
	return flatTensorsOver(m.contract.Variables, make([]float32, flatSize(m.contract.Variables)))
}

// FlatTensorsOver returns a FlatTensors shaped like the model's variables whose Data is data
// itself, not a copy: for a buffer the caller allocates elsewhere, such as the host memory a
// collective backend moves without staging (horovod.Horovod.AllocHost). data must hold exactly
// as many values as the variables have; its values are kept.
func (m *Model) FlatTensorsOver(data []float32) (*FlatTensors, error) {
	if total := flatSize(m.contract.Variables); len(data) != total {
		return nil, fmt.Errorf("bertgraph: a buffer of %d float32 values for the model's %d variables, which have %d (%d bytes)",
			len(data), len(m.contract.Variables), total, 4*total)
	}
	return flatTensorsOver(m.contract.Variables, data), nil
}

// flatSize is the number of values of vars together.
func flatSize(vars []VariableSpec) int {
	total := 0
	for _, v := range vars {
		total += v.NumElements()
	}
	return total
}

// flatTensorsOver cuts data, flatSize(vars) values long, into one view per variable, each
// keeping data's capacity beyond it (see FlatTensors).
func flatTensorsOver(vars []VariableSpec, data []float32) *FlatTensors {
	f := &FlatTensors{Data: data, Parts: make([][]float32, len(vars))}
	off := 0
	for i, v := range vars {
		n := v.NumElements()
		f.Parts[i] = f.Data[off : off+n]
		off += n
	}
	return f
}

// check verifies f is shaped like vars.
func (f *FlatTensors) check(vars []VariableSpec) error {
	if f == nil || len(f.Parts) != len(vars) {
		n := 0
		if f != nil {
			n = len(f.Parts)
		}
		return fmt.Errorf("bertgraph: %d tensors for %d variables (allocate them with Model.NewFlatTensors)", n, len(vars))
	}
	for i, v := range vars {
		if len(f.Parts[i]) != v.NumElements() {
			return fmt.Errorf("bertgraph: tensor %d (%s) has %d elements, the variable %v has %d",
				i, v.Name, len(f.Parts[i]), v.Shape, v.NumElements())
		}
	}
	return nil
}

// copyOut copies t's float32 values into dst in place. The caller names t in its error, built
// only on failure: TrainStep calls this for every variable every step. The count is checked
// before the copy: dst's capacity may reach into the next variable (FlatTensors), which a
// tensor of the wrong size would overwrite.
func copyOut(t *tf.Tensor, dst []float32) error {
	if n := t.NumElements(); n != int64(len(dst)) {
		return fmt.Errorf("%d elements, want %d", n, len(dst))
	}
	_, err := tf.Values(t, dst[:0])
	return err
}

// reuse returns t overwritten with values when its shape is shape, else a new tensor (t closed).
func reuse[T tf.Scalar](t *tf.Tensor, values []T, shape ...int64) (*tf.Tensor, error) {
	if t != nil && slices.Equal(t.Shape(), shape) {
		if err := tf.Overwrite(t, values); err == nil {
			return t, nil
		}
	}
	t.Close()
	return tf.NewTensor(values, shape...)
}

// batchTensors are the feeds of one batch, kept across steps and overwritten in place while
// the batch size stays the same.
type batchTensors struct {
	ids, mask, segments, labels, real, seed *tf.Tensor
}

func (b *batchTensors) close() {
	for _, t := range []*tf.Tensor{b.ids, b.mask, b.segments, b.labels, b.real, b.seed} {
		t.Close()
	}
	*b = batchTensors{}
}

// set fills the feature tensors (and, with labels, the label tensors) from batch, after
// checking every value against c: TensorFlow's gather and one_hot would silently turn an
// out-of-range input id, segment id or label id into zeros, and the loss would train on them.
func (b *batchTensors) set(batch *features.Batch, c *Contract, labels bool) error {
	if batch == nil || batch.BatchSize < 1 {
		return fmt.Errorf("bertgraph: empty batch")
	}
	seqLength := c.MaxSeqLength
	if batch.SeqLength != seqLength {
		return fmt.Errorf("bertgraph: batch has sequence length %d, the model takes %d", batch.SeqLength, seqLength)
	}
	n, s := int64(batch.BatchSize), int64(seqLength)
	if int64(len(batch.InputIDs)) != n*s || int64(len(batch.InputMask)) != n*s || int64(len(batch.SegmentIDs)) != n*s {
		return fmt.Errorf("bertgraph: batch has %d input_ids, %d input_mask and %d segment_ids values, want %d x %d each",
			len(batch.InputIDs), len(batch.InputMask), len(batch.SegmentIDs), n, s)
	}
	if err := checkRange("input_ids", batch.InputIDs, seqLength, c.VocabSize, "the vocabulary has %d tokens"); err != nil {
		return err
	}
	if err := checkRange("input_mask", batch.InputMask, seqLength, 2, "a mask is 0 or 1 (%d values)"); err != nil {
		return err
	}
	if err := checkRange("segment_ids", batch.SegmentIDs, seqLength, c.TypeVocabSize, "the model has %d token types"); err != nil {
		return err
	}
	var err error
	if b.ids, err = reuse(b.ids, batch.InputIDs, n, s); err != nil {
		return err
	}
	if b.mask, err = reuse(b.mask, batch.InputMask, n, s); err != nil {
		return err
	}
	if b.segments, err = reuse(b.segments, batch.SegmentIDs, n, s); err != nil {
		return err
	}
	if !labels {
		return nil
	}
	if int64(len(batch.LabelIDs)) != n || int64(len(batch.IsRealExample)) != n {
		return fmt.Errorf("bertgraph: batch has %d labels and %d is_real_example for %d examples",
			len(batch.LabelIDs), len(batch.IsRealExample), n)
	}
	if err := checkRange("label_ids", batch.LabelIDs, 1, c.NumLabels, "the model has %d labels"); err != nil {
		return err
	}
	if err := checkRange("is_real_example", batch.IsRealExample, 1, 2, "a flag is 0 or 1 (%d values)"); err != nil {
		return err
	}
	if b.labels, err = reuse(b.labels, batch.LabelIDs, n); err != nil {
		return err
	}
	b.real, err = reuse(b.real, batch.IsRealExample, n)
	return err
}

// checkRange checks every value of tensor (rows of width values) is in [0, limit); the error
// names the tensor, the example, the position in it (for a per-token tensor) and the value.
func checkRange(tensor string, values []int32, width, limit int, why string) error {
	for i, v := range values {
		if v >= 0 && int(v) < limit {
			continue
		}
		where := fmt.Sprintf("example %d", i/width)
		if width > 1 {
			where += fmt.Sprintf(" position %d", i%width)
		}
		return fmt.Errorf("bertgraph: batch %s has %s %d, want 0..%d: "+why, where, tensor, v, limit-1, limit)
	}
	return nil
}

// feedInto puts the batch tensors into feeds under s's input names: s.feeds for the reused
// train_step feeds, a map of the caller's own for a call that may run concurrently.
func (b *batchTensors) feedInto(feeds map[tf.Output]*tf.Tensor, s *signature, labels bool) {
	feeds[s.inputs["input_ids"]] = b.ids
	feeds[s.inputs["input_mask"]] = b.mask
	feeds[s.inputs["segment_ids"]] = b.segments
	if labels {
		feeds[s.inputs["label_ids"]] = b.labels
		feeds[s.inputs["is_real_example"]] = b.real
	}
}

// newFeeds checks batch against c and copies it into new tensors fed to s (the labels too, with
// labels): the feeds of a call that may run concurrently. The caller closes the tensors after
// the run.
func newFeeds(batch *features.Batch, c *Contract, s *signature, labels bool) (map[tf.Output]*tf.Tensor, *batchTensors, error) {
	in := &batchTensors{}
	if err := in.set(batch, c, labels); err != nil {
		in.close()
		return nil, nil, err
	}
	feeds := make(map[tf.Output]*tf.Tensor, 5)
	in.feedInto(feeds, s, labels)
	return feeds, in, nil
}
