package tfrecord

import (
	"bufio"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"io"
	"slices"
)

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

// maskedCRC is TFRecord's checksum: CRC32C, rotated and offset so that a CRC of data that itself
// contains CRCs stays well distributed.
func maskedCRC(b []byte) uint32 {
	c := crc32.Checksum(b, castagnoli)
	return (c>>15 | c<<17) + 0xa282ead8
}

// Writer frames records onto an io.Writer. It does not buffer: give it a *bufio.Writer for
// many small records and flush that at the end.
type Writer struct {
	w      io.Writer
	header [12]byte
}

// NewWriter returns a Writer appending to w.
func NewWriter(w io.Writer) *Writer { return &Writer{w: w} }

// Write appends one record.
func (w *Writer) Write(record []byte) error {
	binary.LittleEndian.PutUint64(w.header[:8], uint64(len(record)))
	binary.LittleEndian.PutUint32(w.header[8:], maskedCRC(w.header[:8]))
	var footer [4]byte
	binary.LittleEndian.PutUint32(footer[:], maskedCRC(record))
	for _, b := range [][]byte{w.header[:], record, footer[:]} {
		if _, err := w.w.Write(b); err != nil {
			return fmt.Errorf("tfrecord: writing record: %w", err)
		}
	}
	return nil
}

// CorruptError is a malformed record: the file, the byte offset where the record starts, and
// what is wrong.
type CorruptError struct {
	Path   string
	Offset int64
	Reason string
}

func (e *CorruptError) Error() string {
	return fmt.Sprintf("tfrecord: %s: record at byte offset %d: %s", e.Path, e.Offset, e.Reason)
}

// maxRecordBytes bounds a record's declared length, so a corrupt length whose CRC happens to
// match cannot make the reader allocate without limit.
const maxRecordBytes = 1 << 31

// Reader reads framed records, checking both checksums.
type Reader struct {
	r      *bufio.Reader
	path   string
	offset int64
	buf    []byte   // the last record's data and checksum, reused
	header [12]byte // reused too: read through an interface, a local would escape each call
	// err is the error of the record at offset, which every later Next returns again: the
	// stream is then somewhere in or past that record.
	err error
}

// NewReader reads records from r; path names it in errors.
func NewReader(r io.Reader, path string) *Reader {
	return &Reader{r: bufio.NewReaderSize(r, 1<<16), path: path}
}

// Reset reads from src from its start, keeping the buffers: a reader of many files (a
// dataset, file after file, epoch after epoch) needs one Reader.
func (r *Reader) Reset(src io.Reader, path string) {
	r.r.Reset(src)
	r.path, r.offset, r.err = path, 0, nil
}

// Offset is the byte offset of the next record.
func (r *Reader) Offset() int64 { return r.offset }

// Next returns the next record's data, valid until the following call; io.EOF after the last
// record; a *CorruptError for a bad checksum or a truncated record, and that same error from
// every later call, as TensorFlow's reader, which reads by offset, fails on the record again.
func (r *Reader) Next() ([]byte, error) {
	if r.err != nil {
		return nil, r.err
	}
	data, err := r.next()
	if err != nil && err != io.EOF {
		r.err = err
	}
	return data, err
}

// next reads one record; Next keeps its error.
func (r *Reader) next() ([]byte, error) {
	header := r.header[:]
	n, err := io.ReadFull(r.r, header)
	if err == io.EOF {
		return nil, io.EOF
	}
	if err != nil {
		return nil, r.readError(err, fmt.Sprintf("truncated header: %d of 12 bytes", n))
	}
	if got, want := binary.LittleEndian.Uint32(header[8:]), maskedCRC(header[:8]); got != want {
		if r.offset == 0 && header[0] == 0x1f && header[1] == 0x8b {
			// TFRecordOptions(compression_type="GZIP") writes the whole file through gzip.
			return nil, r.corrupt("the file is gzip-compressed (starts with 1f 8b): compressed TFRecord files are not read; decompress it first")
		}
		return nil, r.corrupt(fmt.Sprintf("length checksum mismatch (stored %#08x, computed %#08x)", got, want))
	}
	length := binary.LittleEndian.Uint64(header[:8])
	if length > maxRecordBytes {
		return nil, r.corrupt(fmt.Sprintf("record length %d exceeds %d bytes", length, maxRecordBytes))
	}
	body, n, err := r.readBody(int(length) + 4)
	if err != nil {
		return nil, r.readError(err, fmt.Sprintf("truncated record: %d of %d data+checksum bytes", n, length+4))
	}
	data := body[:length]
	if got, want := binary.LittleEndian.Uint32(body[length:]), maskedCRC(data); got != want {
		return nil, r.corrupt(fmt.Sprintf("data checksum mismatch (stored %#08x, computed %#08x)", got, want))
	}
	r.offset += 12 + int64(length) + 4
	return data, nil
}

// readBody reads n bytes into the reader's buffer, growing it a chunk at a time so that a
// corrupt length costs memory only as far as the data really goes.
func (r *Reader) readBody(n int) ([]byte, int, error) {
	const chunk = 1 << 20
	buf := r.buf[:0]
	for len(buf) < n {
		step := min(n-len(buf), chunk)
		buf = slices.Grow(buf, step)
		got, err := io.ReadFull(r.r, buf[len(buf):len(buf)+step])
		buf = buf[:len(buf)+got]
		if err != nil {
			r.buf = buf
			return nil, len(buf), err
		}
	}
	r.buf = buf
	return buf, n, nil
}

func (r *Reader) corrupt(reason string) error {
	return &CorruptError{Path: r.path, Offset: r.offset, Reason: reason}
}

func (r *Reader) readError(err error, truncated string) error {
	if errors.Is(err, io.ErrUnexpectedEOF) || errors.Is(err, io.EOF) {
		return r.corrupt(truncated)
	}
	return fmt.Errorf("tfrecord: %s: reading record at byte offset %d: %w", r.path, r.offset, err)
}
