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
	f := features.InputFeatures{InputIDs: make([]int32, seqLength), InputMask: make([]int32, seqLength), SegmentIDs: make([]int32, seqLength)}
	err := decodeInto(record, &f)
	return f, err
}

// decodedInt64s is what one feature's last entry held: its count, and the first value outside
// int32 (when overflow).
type decodedInt64s struct {
	present  bool
	n        int
	overflow bool
	bad      int64
}

// read walks list, storing up to len(dst) values into dst (converted to int32).
func (d *decodedInt64s) read(list []byte, dst []int32) error {
	*d = decodedInt64s{present: true}
	return eachInt64(list, func(x int64) {
		if x != int64(int32(x)) && !d.overflow {
			d.overflow, d.bad = true, x
		}
		if d.n < len(dst) {
			dst[d.n] = int32(x)
		}
		d.n++
	})
}

// decodeInto is DecodeFeatures writing into f's sequences, whose length is the record's
// seq_length (views into a batch, say): nothing is allocated.
func decodeInto(record []byte, f *features.InputFeatures) error {
	seqLength := len(f.InputIDs)
	var seqs [3]decodedInt64s
	var label, real decodedInt64s
	var labelValue, realValue [1]int32
	err := eachFeature(record, func(key, list []byte) error {
		switch string(key) {
		case KeyInputIDs:
			return seqs[0].read(list, f.InputIDs)
		case KeyInputMask:
			return seqs[1].read(list, f.InputMask)
		case KeySegmentIDs:
			return seqs[2].read(list, f.SegmentIDs)
		case KeyLabelIDs:
			return label.read(list, labelValue[:])
		case KeyIsRealExample:
			return real.read(list, realValue[:])
		}
		var other decodedInt64s
		return other.read(list, nil)
	})
	if err != nil {
		return err
	}
	for i, key := range [3]string{KeyInputIDs, KeyInputMask, KeySegmentIDs} {
		if err := seqs[i].check(key, seqLength); err != nil {
			return err
		}
	}
	if err := label.check(KeyLabelIDs, 1); err != nil {
		return err
	}
	f.LabelID = labelValue[0]
	// Absent, is_real_example is 1.
	if real.present {
		if err := real.check(KeyIsRealExample, 1); err != nil {
			return err
		}
	} else {
		realValue[0] = 1
	}
	f.IsRealExample = realValue[0] == 1
	return nil
}

// check requires the feature with n int32 values.
func (d *decodedInt64s) check(key string, n int) error {
	switch {
	case !d.present:
		return fmt.Errorf("tfrecord: feature %q is missing", key)
	case d.n != n && n == 1:
		return fmt.Errorf("tfrecord: feature %q has %d values, want one", key, d.n)
	case d.n != n:
		return fmt.Errorf("tfrecord: feature %q has %d values, want max_seq_length %d", key, d.n, n)
	case d.overflow:
		return fmt.Errorf("tfrecord: feature %q value %d overflows int32", key, d.bad)
	}
	return nil
}
