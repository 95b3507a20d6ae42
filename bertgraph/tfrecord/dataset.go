package tfrecord

import (
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"slices"

	"github.com/gorovod/gorovod/bertgraph/features"
)

// DatasetOptions configure a Dataset: the order of operations is Horovod's BERT input function,
// shard(Size, Rank) -> shuffle(ShuffleBuffer, Seed) -> repeat.
type DatasetOptions struct {
	// Rank and Size: record j (0-based over the files in order) belongs to rank j % Size, as
	// tf.data's shard. Size 0 means 1.
	Rank, Size int
	// ShuffleBuffer: records are drawn at random from a buffer of this many (tf.data's shuffle);
	// 0 or 1 keeps file order. Each epoch is reshuffled with a generator seeded by (Seed, epoch),
	// so the order is reproducible.
	ShuffleBuffer int
	Seed          uint64
	// Repeat starts over after the last record, forever (training).
	Repeat bool
}

// Dataset reads records of TFRecord files for one rank.
type Dataset struct {
	paths []string
	opts  DatasetOptions
	epoch uint64

	file    *os.File
	reader  *Reader
	fileIdx int
	index   int // record index over all files, this epoch
	mine    int // records of this rank, this epoch

	buf []Record
	rng *rand.Rand
}

// Record is one record's data and where it was read.
type Record struct {
	Data   []byte
	Path   string
	Offset int64
}

// OpenDataset checks that every path can be opened and returns a Dataset over them.
func OpenDataset(paths []string, opts DatasetOptions) (*Dataset, error) {
	var err error
	if opts.Size, err = features.ShardSize(opts.Rank, opts.Size); err != nil {
		return nil, fmt.Errorf("tfrecord: %w", err)
	}
	if len(paths) == 0 {
		return nil, fmt.Errorf("tfrecord: no input files")
	}
	for _, p := range paths {
		f, err := os.Open(p)
		if err != nil {
			return nil, fmt.Errorf("tfrecord: %w", err)
		}
		f.Close()
	}
	d := &Dataset{paths: slices.Clone(paths), opts: opts, fileIdx: -1}
	d.startEpoch()
	return d, nil
}

func (d *Dataset) startEpoch() {
	d.fileIdx, d.index, d.mine = -1, 0, 0
	d.rng = rand.New(rand.NewPCG(d.opts.Seed, d.epoch))
}

// Epoch is the 0-based number of the pass over the files in progress.
func (d *Dataset) Epoch() uint64 { return d.epoch }

// Close closes the open file.
func (d *Dataset) Close() error {
	if d.file == nil {
		return nil
	}
	err := d.file.Close()
	d.file, d.reader = nil, nil
	return err
}

// nextInShard returns a copy of this rank's next record in file order this epoch, or io.EOF.
func (d *Dataset) nextInShard() (Record, error) {
	for {
		if d.reader == nil {
			if d.fileIdx+1 >= len(d.paths) {
				return Record{}, io.EOF
			}
			d.fileIdx++
			f, err := os.Open(d.paths[d.fileIdx])
			if err != nil {
				return Record{}, fmt.Errorf("tfrecord: %w", err)
			}
			d.file, d.reader = f, NewReader(f, d.paths[d.fileIdx])
		}
		offset := d.reader.Offset()
		rec, err := d.reader.Next()
		if err == io.EOF {
			d.Close()
			continue
		}
		if err != nil {
			return Record{}, err
		}
		j := d.index
		d.index++
		if j%d.opts.Size == d.opts.Rank {
			d.mine++
			return Record{Data: slices.Clone(rec), Path: d.paths[d.fileIdx], Offset: offset}, nil
		}
	}
}

// Next returns this rank's next record (the caller owns its data), io.EOF at the end unless
// Repeat, or the first read or corruption error.
func (d *Dataset) Next() (Record, error) {
	for {
		rec, err := d.nextShuffled()
		if err != io.EOF || !d.opts.Repeat {
			return rec, err
		}
		if d.mine == 0 {
			return Record{}, fmt.Errorf("tfrecord: rank %d of %d has no records in %v: cannot repeat an empty shard", d.opts.Rank, d.opts.Size, d.paths)
		}
		d.epoch++
		d.startEpoch()
	}
}

// nextShuffled is tf.data's shuffle: keep the buffer full, emit a uniformly chosen element, put
// the next input in its place; at the end of the input, drain the buffer in random order.
func (d *Dataset) nextShuffled() (Record, error) {
	if d.opts.ShuffleBuffer <= 1 {
		return d.nextInShard()
	}
	for len(d.buf) < d.opts.ShuffleBuffer {
		rec, err := d.nextInShard()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return Record{}, err
		}
		d.buf = append(d.buf, rec)
	}
	if len(d.buf) == 0 {
		return Record{}, io.EOF
	}
	k := d.rng.IntN(len(d.buf))
	rec := d.buf[k]
	last := len(d.buf) - 1
	d.buf[k] = d.buf[last]
	d.buf[last] = Record{}
	d.buf = d.buf[:last]
	return rec, nil
}

// NextBatch decodes the next batchSize records into a batch of sequences of seqLength. At the
// end of a non-repeating dataset the last partial batch is dropped with dropRemainder and
// otherwise padded with padding examples (IsRealExample 0); io.EOF when nothing is left.
// The batch's GUIDs are the real records' "path@offset" positions.
func (d *Dataset) NextBatch(batchSize, seqLength int, dropRemainder bool) (*features.Batch, error) {
	b := features.NewBatch(batchSize, seqLength)
	n := 0
	for ; n < batchSize; n++ {
		rec, err := d.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			return nil, err
		}
		f, err := DecodeFeatures(rec.Data, seqLength)
		if err != nil {
			return nil, fmt.Errorf("%s: record at byte offset %d: %w", rec.Path, rec.Offset, err)
		}
		if f.IsRealExample {
			b.GUIDs = append(b.GUIDs, fmt.Sprintf("%s@%d", rec.Path, rec.Offset))
		}
		s := seqLength
		copy(b.InputIDs[n*s:], f.InputIDs)
		copy(b.InputMask[n*s:], f.InputMask)
		copy(b.SegmentIDs[n*s:], f.SegmentIDs)
		b.LabelIDs[n] = f.LabelID
		if f.IsRealExample {
			b.IsRealExample[n] = 1
		}
	}
	if n == 0 || (n < batchSize && dropRemainder) {
		return nil, io.EOF
	}
	return b, nil
}
