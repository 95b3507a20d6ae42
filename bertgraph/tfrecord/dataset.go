package tfrecord

import (
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"slices"
	"strconv"

	"github.com/gorovod/gorovod/bertgraph/features"
	records "github.com/gorovod/gorovod/tf/tfrecord"
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
	// epochLen is the number of records of this rank in an epoch, once one has ended (Repeat).
	epochLen int64

	file    *os.File
	reader  *records.Reader // reading file; nil between files
	reuse   *records.Reader // the last reader, reset onto the next file
	fileIdx int
	index   int // record index over all files, this epoch
	mine    int // records of this rank, this epoch

	buf []Record
	rng *rand.Rand
	// spare holds the data buffers of records ReadBatch has decoded, for the next records read:
	// a training run reads without allocating once the shuffle buffer is full.
	spare [][]byte
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
			if d.reuse == nil {
				d.reuse = records.NewReader(f, d.paths[d.fileIdx])
			} else {
				d.reuse.Reset(f, d.paths[d.fileIdx])
			}
			d.file, d.reader = f, d.reuse
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
			var data []byte
			if n := len(d.spare); n > 0 {
				data, d.spare = d.spare[n-1], d.spare[:n-1]
			}
			return Record{Data: append(data[:0], rec...), Path: d.paths[d.fileIdx], Offset: offset}, nil
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
		d.epochLen = int64(d.mine)
		d.epoch++
		d.startEpoch()
	}
}

// Skip advances past n records as n calls of Next would, and a repeating dataset at a cost that
// does not grow with n: every epoch emits all of the shard's records (the shuffle buffer drains
// before the next epoch starts) in an order drawn from (Seed, epoch) alone, so once the first
// epoch has ended, whole epochs are passed over by their number. At most two epochs are read.
func (d *Dataset) Skip(n int64) error {
	for ; n > 0; n-- {
		// mine-len(buf) records of this epoch were emitted: all of them, at its end.
		if L := d.epochLen; L > 0 && n > L && int64(d.mine-len(d.buf)) == L {
			whole := (n - 1) / L // the last record is left to Next, which reads it in its epoch
			d.Close()
			d.epoch += uint64(whole) + 1
			d.startEpoch()
			n -= whole * L
		}
		if _, err := d.Next(); err != nil {
			return err
		}
	}
	return nil
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

// NextBatch decodes the next batchSize records into a new batch of sequences of seqLength. At
// the end of a non-repeating dataset the last partial batch is dropped with dropRemainder and
// otherwise padded with padding examples (IsRealExample 0); io.EOF when nothing is left.
// The batch's GUIDs are the real records' "path@offset" positions.
func (d *Dataset) NextBatch(batchSize, seqLength int, dropRemainder bool) (*features.Batch, error) {
	b := features.NewBatch(batchSize, seqLength)
	if err := d.readBatch(b, dropRemainder, true); err != nil {
		return nil, err
	}
	return b, nil
}

// ReadBatch is NextBatch into b, reused (b.BatchSize records of b.SeqLength; rows not filled
// are cleared to padding examples), without GUIDs: the training loop's way, which allocates
// nothing per batch. On an error b's contents are undefined.
func (d *Dataset) ReadBatch(b *features.Batch, dropRemainder bool) error {
	return d.readBatch(b, dropRemainder, false)
}

func (d *Dataset) readBatch(b *features.Batch, dropRemainder, guids bool) error {
	b.GUIDs = b.GUIDs[:0]
	s := b.SeqLength
	n := 0
	for ; n < b.BatchSize; n++ {
		rec, err := d.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			return err
		}
		row := b.Row(n)
		if err := decodeInto(rec.Data, &row); err != nil {
			return fmt.Errorf("%s: record at byte offset %d: %w", rec.Path, rec.Offset, err)
		}
		d.spare = append(d.spare, rec.Data)
		b.LabelIDs[n], b.IsRealExample[n] = row.LabelID, 0
		if row.IsRealExample {
			b.IsRealExample[n] = 1
			if guids {
				b.GUIDs = append(b.GUIDs, rec.Path+"@"+strconv.FormatInt(rec.Offset, 10))
			}
		}
	}
	if n == 0 || (n < b.BatchSize && dropRemainder) {
		return io.EOF
	}
	clear(b.InputIDs[n*s:])
	clear(b.InputMask[n*s:])
	clear(b.SegmentIDs[n*s:])
	clear(b.LabelIDs[n:])
	clear(b.IsRealExample[n:])
	return nil
}
