package features

import "fmt"

// Batch is BatchSize examples as flattened row-major [BatchSize*SeqLength] int32 slices, the
// layout of the classifier's input tensors.
type Batch struct {
	BatchSize, SeqLength int
	InputIDs             []int32 // [BatchSize*SeqLength]
	InputMask            []int32 // [BatchSize*SeqLength], 1 for real tokens, 0 for padding
	SegmentIDs           []int32 // [BatchSize*SeqLength], 0 for text a, 1 for text b
	LabelIDs             []int32 // [BatchSize]
	// IsRealExample is 1 for a real example and 0 for a padding example (run_classifier's
	// PaddingInputExample: all-zero features, label 0) that fills the last eval/predict batch;
	// metrics weight examples by it.
	IsRealExample []int32 // [BatchSize]
	// GUIDs of the real examples, in order, when known (text input); padding examples have none.
	GUIDs []string
}

// NewBatch returns a zeroed batch: every example a padding one until filled.
func NewBatch(batchSize, seqLength int) *Batch {
	n := batchSize * seqLength
	buf := make([]int32, 3*n+2*batchSize)
	return &Batch{
		BatchSize: batchSize, SeqLength: seqLength,
		InputIDs:      buf[:n:n],
		InputMask:     buf[n : 2*n : 2*n],
		SegmentIDs:    buf[2*n : 3*n : 3*n],
		LabelIDs:      buf[3*n : 3*n+batchSize : 3*n+batchSize],
		IsRealExample: buf[3*n+batchSize:],
	}
}

// NumReal is the number of real examples.
func (b *Batch) NumReal() int {
	n := 0
	for _, r := range b.IsRealExample {
		n += int(r)
	}
	return n
}

// Row returns example i's features (views into the batch).
func (b *Batch) Row(i int) InputFeatures {
	s := b.SeqLength
	return InputFeatures{
		InputIDs:      b.InputIDs[i*s : (i+1)*s],
		InputMask:     b.InputMask[i*s : (i+1)*s],
		SegmentIDs:    b.SegmentIDs[i*s : (i+1)*s],
		LabelID:       b.LabelIDs[i],
		IsRealExample: b.IsRealExample[i] == 1,
	}
}

// ConvertBatch converts examples (at most batchSize) into a new batch; the rows after the last
// example are padding examples.
func (c *Converter) ConvertBatch(examples []InputExample, batchSize int) (*Batch, error) {
	if len(examples) > batchSize {
		return nil, fmt.Errorf("features: %d examples do not fit a batch of %d", len(examples), batchSize)
	}
	b := NewBatch(batchSize, c.maxSeqLength)
	var scratch []int32
	s := c.maxSeqLength
	for i, ex := range examples {
		label, err := c.convertInto(ex, b.InputIDs[i*s:(i+1)*s], b.InputMask[i*s:(i+1)*s], b.SegmentIDs[i*s:(i+1)*s], &scratch)
		if err != nil {
			return nil, err
		}
		b.LabelIDs[i] = label
		b.IsRealExample[i] = 1
		b.GUIDs = append(b.GUIDs, ex.GUID)
	}
	return b, nil
}
