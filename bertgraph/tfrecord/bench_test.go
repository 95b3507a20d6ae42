package tfrecord

import (
	"bytes"
	"math/rand/v2"
	"os"
	"path/filepath"
	"testing"

	"github.com/gorovod/gorovod/bertgraph/features"
	records "github.com/gorovod/gorovod/tf/tfrecord"
)

// BenchmarkReadBatch is the training loop's input: batches of 32 sequences of 32 drawn from a
// shuffled, repeating dataset of run_classifier records (allocations per batch are the figure).
// NextBatch, which builds a new batch with the records' positions as GUIDs, runs beside it.
func BenchmarkReadBatch(b *testing.B) {
	const batch, seq, numRecords = 32, 32, 1024
	rng := rand.New(rand.NewPCG(7, 8))
	var buf bytes.Buffer
	w := records.NewWriter(&buf)
	for range numRecords {
		if err := w.Write(EncodeFeatures(randomFeatures(rng, seq))); err != nil {
			b.Fatal(err)
		}
	}
	path := filepath.Join(b.TempDir(), "train.tf_record")
	if err := os.WriteFile(path, buf.Bytes(), 0o644); err != nil {
		b.Fatal(err)
	}
	open := func(b *testing.B) *Dataset {
		d, err := OpenDataset([]string{path}, DatasetOptions{ShuffleBuffer: 100, Seed: 1, Repeat: true})
		if err != nil {
			b.Fatal(err)
		}
		b.Cleanup(func() { d.Close() })
		return d
	}
	b.Run("ReadBatch", func(b *testing.B) {
		d := open(b)
		into := features.NewBatch(batch, seq)
		b.ReportAllocs()
		for b.Loop() {
			if err := d.ReadBatch(into, true); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("NextBatch", func(b *testing.B) {
		d := open(b)
		b.ReportAllocs()
		for b.Loop() {
			if _, err := d.NextBatch(batch, seq, true); err != nil {
				b.Fatal(err)
			}
		}
	})
}
