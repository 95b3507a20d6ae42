package tfrecord

import (
	"bytes"
	"errors"
	"io"
	"testing"

	"github.com/gorovod/gorovod/bertgraph/features"
	records "github.com/gorovod/gorovod/tf/tfrecord"
)

// FuzzReader: any bytes give records and then io.EOF or a *records.CorruptError at an offset inside
// the input, never a panic.
func FuzzReader(f *testing.F) {
	var buf bytes.Buffer
	w := records.NewWriter(&buf)
	w.Write([]byte("record"))
	w.Write(EncodeExample(map[string][]int64{"input_ids": {101, 102}}))
	w.Write(EncodeExample(map[string][]int64{KeyInputIDs: {101, 102}, KeyInputMask: {1, 1}, KeySegmentIDs: {0, 1}, KeyLabelIDs: {1}}))
	f.Add(buf.Bytes())
	f.Add(buf.Bytes()[:20])
	f.Add([]byte{})
	f.Fuzz(func(t *testing.T, data []byte) {
		r := records.NewReader(bytes.NewReader(data), "fuzz")
		for {
			rec, err := r.Next()
			if err == io.EOF {
				return
			}
			var ce *records.CorruptError
			if err != nil {
				if !errors.As(err, &ce) || ce.Offset < 0 || ce.Offset >= int64(len(data)) {
					t.Fatalf("error %v", err)
				}
				return
			}
			checkDecodeFeatures(t, rec, 2)
		}
	})
}

// checkDecodeFeatures compares DecodeFeatures with parse_single_example's rules applied to
// DecodeExample's map: the same features, or an error from both.
func checkDecodeFeatures(t *testing.T, rec []byte, seq int) {
	t.Helper()
	got, err := DecodeFeatures(rec, seq)
	m, merr := DecodeExample(rec)
	want, ok := features.InputFeatures{}, merr == nil
	int32s := func(key string, n int) []int32 {
		v, present := m[key]
		if !present || len(v) != n {
			ok = false
			return nil
		}
		out := make([]int32, n)
		for i, x := range v {
			if x != int64(int32(x)) {
				ok = false
			}
			out[i] = int32(x)
		}
		return out
	}
	if ok {
		want.InputIDs, want.InputMask, want.SegmentIDs = int32s(KeyInputIDs, seq), int32s(KeyInputMask, seq), int32s(KeySegmentIDs, seq)
		if l := int32s(KeyLabelIDs, 1); ok {
			want.LabelID = l[0]
		}
		want.IsRealExample = true
		if _, present := m[KeyIsRealExample]; present {
			if r := int32s(KeyIsRealExample, 1); ok {
				want.IsRealExample = r[0] == 1
			}
		}
	}
	if ok != (err == nil) || ok && !sameFeatures(got, want) {
		t.Fatalf("record %x: DecodeFeatures %+v, %v; by DecodeExample's map %+v (valid %v)", rec, got, err, want, ok)
	}
}
