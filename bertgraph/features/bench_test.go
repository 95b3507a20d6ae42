package features

import (
	"fmt"
	"io"
	"runtime"
	"testing"

	"github.com/gorovod/gorovod/bertgraph/datatests"
)

// BenchmarkConvertParallel streams the IMDB train split (39,680 reviews) from disk through
// Reader and Stream into batches of 32 x 128, with one worker and with every core, and reports
// examples/s.
func BenchmarkConvertParallel(b *testing.B) {
	path := datatests.IMDB(b, "train")
	tok, _ := miniLMTokenizer(b, 0)
	labels, err := LabelsFromFile(path, ReadOptions{})
	if err != nil {
		b.Fatal(err)
	}
	conv, err := NewConverter(tok, 128, labels)
	if err != nil {
		b.Fatal(err)
	}
	for _, workers := range []int{1, runtime.GOMAXPROCS(0)} {
		b.Run(fmt.Sprintf("workers=%d", workers), func(b *testing.B) {
			examples := 0
			for b.Loop() {
				r, err := Open(path, ReadOptions{Labels: labels})
				if err != nil {
					b.Fatal(err)
				}
				s := conv.Stream(r, StreamOptions{BatchSize: 32, Workers: workers})
				for {
					_, err := s.Next()
					if err == io.EOF {
						break
					}
					if err != nil {
						b.Fatal(err)
					}
				}
				s.Close()
				examples = r.Counts().Read
				r.Close()
			}
			b.ReportMetric(float64(examples)*float64(b.N)/b.Elapsed().Seconds(), "examples/s")
		})
	}
}
