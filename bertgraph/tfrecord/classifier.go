package tfrecord

import (
	"fmt"

	"github.com/gorovod/gorovod/bertgraph/features"
)

// The feature keys of run_classifier.py's file_based_convert_examples_to_features.
const (
	KeyInputIDs      = "input_ids"
	KeyInputMask     = "input_mask"
	KeySegmentIDs    = "segment_ids"
	KeyLabelIDs      = "label_ids"
	KeyIsRealExample = "is_real_example"
)

// EncodeFeatures returns f as run_classifier writes it: a tf.train.Example of five int64
// features, label_ids and is_real_example holding one value each.
func EncodeFeatures(f features.InputFeatures) []byte {
	real := int64(0)
	if f.IsRealExample {
		real = 1
	}
	return EncodeExample(map[string][]int64{
		KeyInputIDs:      widen(f.InputIDs),
		KeyInputMask:     widen(f.InputMask),
		KeySegmentIDs:    widen(f.SegmentIDs),
		KeyLabelIDs:      {int64(f.LabelID)},
		KeyIsRealExample: {real},
	})
}

func widen(xs []int32) []int64 {
	out := make([]int64, len(xs))
	for i, x := range xs {
		out[i] = int64(x)
	}
	return out
}

// DecodeFeatures parses a run_classifier record whose sequences have seqLength entries, as
// tf.io.parse_single_example with FixedLenFeature([seq_length], tf.int64) does: a missing
// feature or a length other than declared is an error. is_real_example may be absent (records
// written before it existed are all real).
func DecodeFeatures(record []byte, seqLength int) (features.InputFeatures, error) {
	var f features.InputFeatures
	m, err := DecodeExample(record)
	if err != nil {
		return f, err
	}
	seq := func(key string) ([]int32, error) {
		v, ok := m[key]
		if !ok {
			return nil, fmt.Errorf("tfrecord: feature %q is missing", key)
		}
		if len(v) != seqLength {
			return nil, fmt.Errorf("tfrecord: feature %q has %d values, want max_seq_length %d", key, len(v), seqLength)
		}
		out := make([]int32, len(v))
		for i, x := range v {
			if x != int64(int32(x)) {
				return nil, fmt.Errorf("tfrecord: feature %q value %d overflows int32", key, x)
			}
			out[i] = int32(x)
		}
		return out, nil
	}
	if f.InputIDs, err = seq(KeyInputIDs); err != nil {
		return f, err
	}
	if f.InputMask, err = seq(KeyInputMask); err != nil {
		return f, err
	}
	if f.SegmentIDs, err = seq(KeySegmentIDs); err != nil {
		return f, err
	}
	if f.LabelID, err = scalar(m, KeyLabelIDs, nil); err != nil {
		return f, err
	}
	one := int32(1)
	real, err := scalar(m, KeyIsRealExample, &one)
	f.IsRealExample = real == 1
	return f, err
}

func scalar(m map[string][]int64, key string, def *int32) (int32, error) {
	v, ok := m[key]
	if !ok && def != nil {
		return *def, nil
	}
	if !ok {
		return 0, fmt.Errorf("tfrecord: feature %q is missing", key)
	}
	if len(v) != 1 || v[0] != int64(int32(v[0])) {
		return 0, fmt.Errorf("tfrecord: feature %q = %v, want one int32 value", key, v)
	}
	return int32(v[0]), nil
}
