package tfrecord

import (
	"bytes"
	"compress/gzip"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"io"
	"runtime"
	"slices"
	"strings"
	"testing"
)

func TestMaskedCRC(t *testing.T) {
	// CRC-32C's standard check value, then the mask TFRecord applies to it.
	c := crc32.Checksum([]byte("123456789"), castagnoli)
	if c != 0xE3069283 {
		t.Fatalf("crc32c(123456789) = %#x", c)
	}
	if got, want := maskedCRC([]byte("123456789")), (c>>15|c<<17)+0xa282ead8; got != want {
		t.Fatalf("masked = %#x, want %#x", got, want)
	}
}

func writeRecords(t *testing.T, recs [][]byte) []byte {
	t.Helper()
	var buf bytes.Buffer
	w := NewWriter(&buf)
	for _, r := range recs {
		if err := w.Write(r); err != nil {
			t.Fatal(err)
		}
	}
	return buf.Bytes()
}

func TestFramingRoundTripAndCorruption(t *testing.T) {
	recs := [][]byte{[]byte("first"), {}, bytes.Repeat([]byte{7}, 100000)}
	file := writeRecords(t, recs)
	if len(file) != 3*16+5+100000 {
		t.Fatalf("file is %d bytes", len(file))
	}
	r := NewReader(bytes.NewReader(file), "x.tfrecord")
	for i, want := range recs {
		got, err := r.Next()
		if err != nil || !bytes.Equal(got, want) {
			t.Fatalf("record %d: %d bytes, %v", i, len(got), err)
		}
	}
	if _, err := r.Next(); err != io.EOF {
		t.Fatalf("after the last record: %v", err)
	}
	second := int64(16 + 5) // offset of the second record
	third := second + 16
	for _, c := range []struct {
		name   string
		mangle func([]byte) []byte
		offset int64
		reason string
	}{
		{"data", func(b []byte) []byte { b[third+12+500] ^= 1; return b }, third, "data checksum mismatch"},
		{"length", func(b []byte) []byte { b[second] = 9; return b }, second, "length checksum mismatch"},
		{"lengthcrc", func(b []byte) []byte { b[second+9] ^= 0x40; return b }, second, "length checksum mismatch"},
		{"footer", func(b []byte) []byte { b[second+13] ^= 1; return b }, second, "data checksum mismatch"},
		{"truncated data", func(b []byte) []byte { return b[:third+12+99] }, third, "truncated record"},
		{"truncated header", func(b []byte) []byte { return b[:second+7] }, second, "truncated header"},
	} {
		bad := c.mangle(slices.Clone(file))
		r := NewReader(bytes.NewReader(bad), "bad.tfrecord")
		var err error
		for err == nil {
			_, err = r.Next()
		}
		var ce *CorruptError
		if !errors.As(err, &ce) || ce.Offset != c.offset || ce.Path != "bad.tfrecord" || !strings.Contains(ce.Reason, c.reason) {
			t.Errorf("%s: %v, want a corruption at offset %d: %s", c.name, err, c.offset, c.reason)
		}
		if !strings.Contains(err.Error(), fmt.Sprintf("bad.tfrecord: record at byte offset %d", c.offset)) {
			t.Errorf("%s: message %q", c.name, err)
		}
	}
}

// A corrupt length with a matching checksum (1 GiB declared, 100 bytes present) is a truncated
// record, found without allocating the declared size.
func TestHugeLengthIsTruncationNotAllocation(t *testing.T) {
	var file [12 + 100]byte
	binary.LittleEndian.PutUint64(file[:8], 1<<30)
	binary.LittleEndian.PutUint32(file[8:12], maskedCRC(file[:8]))
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	_, err := NewReader(bytes.NewReader(file[:]), "huge.tfrecord").Next()
	runtime.ReadMemStats(&after)
	var ce *CorruptError
	if !errors.As(err, &ce) || ce.Offset != 0 || !strings.Contains(ce.Reason, "truncated record: 100 of 1073741828") {
		t.Fatalf("err %v", err)
	}
	if grew := after.TotalAlloc - before.TotalAlloc; grew > 8<<20 {
		t.Fatalf("allocated %d bytes for a 112-byte file", grew)
	}
}

// After a corrupt record the reader's position in the stream is unknown to the framing (a bad
// length) or past the record (bad data), so every later Next returns the same error, as
// TensorFlow's reader, which reads by offset, fails on that record again: a caller that went on
// must not get the records after it with the corrupt record's offset. Reset starts afresh.
func TestErrorsAreSticky(t *testing.T) {
	recs := [][]byte{[]byte("first"), []byte("second"), []byte("third")}
	file := writeRecords(t, recs)
	second := int64(16 + 5)
	third := second + 16 + 6
	file[second+12] ^= 1 // the data of the second record
	file[third+12] ^= 1  // and of the third
	r := NewReader(bytes.NewReader(file), "bad.tfrecord")
	if _, err := r.Next(); err != nil {
		t.Fatal(err)
	}
	_, first := r.Next()
	var ce *CorruptError
	if !errors.As(first, &ce) || ce.Offset != second {
		t.Fatalf("second record: %v", first)
	}
	for range 2 {
		if rec, err := r.Next(); err != first || r.Offset() != second {
			t.Fatalf("after the error: %q, %v at offset %d; want the same error at offset %d", rec, err, r.Offset(), second)
		}
	}
	r.Reset(bytes.NewReader(writeRecords(t, recs)), "good.tfrecord")
	for _, want := range recs {
		if got, err := r.Next(); err != nil || !bytes.Equal(got, want) {
			t.Fatalf("after Reset: %q, %v", got, err)
		}
	}
}

// A GZIP-compressed TFRecord file (TensorFlow's compression_type="GZIP") is named as one, not
// reported as a bad checksum.
func TestGzipFileIsNamed(t *testing.T) {
	var zipped bytes.Buffer
	z := gzip.NewWriter(&zipped)
	z.Write(writeRecords(t, [][]byte{[]byte("first")}))
	z.Close()
	_, err := NewReader(bytes.NewReader(zipped.Bytes()), "train.tfrecord.gz").Next()
	if err == nil || !strings.Contains(err.Error(), "train.tfrecord.gz: record at byte offset 0: the file is gzip-compressed") {
		t.Fatalf("got %v, want an error saying the file is gzip-compressed", err)
	}
}
