package tfrecord

import (
	"bytes"
	"errors"
	"io"
	"testing"
)

// FuzzReader: any bytes give records and then io.EOF or a *CorruptError at an offset inside
// the input, never a panic.
func FuzzReader(f *testing.F) {
	var buf bytes.Buffer
	w := NewWriter(&buf)
	w.Write([]byte("record"))
	w.Write(EncodeExample(map[string][]int64{"input_ids": {101, 102}}))
	f.Add(buf.Bytes())
	f.Add(buf.Bytes()[:20])
	f.Add([]byte{})
	f.Fuzz(func(t *testing.T, data []byte) {
		r := NewReader(bytes.NewReader(data), "fuzz")
		for {
			rec, err := r.Next()
			if err == io.EOF {
				return
			}
			var ce *CorruptError
			if err != nil {
				if !errors.As(err, &ce) || ce.Offset < 0 || ce.Offset >= int64(len(data)) {
					t.Fatalf("error %v", err)
				}
				return
			}
			DecodeExample(rec) // must not panic
		}
	})
}
