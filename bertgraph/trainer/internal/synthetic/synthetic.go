// Package synthetic writes training data for the trainer's tests and example program: random
// run_classifier examples for a model with labels 0 and 1, in a TFRecord file.
package synthetic

import (
	"bufio"
	"fmt"
	"math/rand/v2"
	"os"

	"github.com/gorovod/gorovod/bertgraph/features"
	"github.com/gorovod/gorovod/bertgraph/tfrecord"
	records "github.com/gorovod/gorovod/tf/tfrecord"
)

// WriteExamples writes n examples of seqLength random token ids below vocabSize to path, with
// seed. The label is the parity of the second id, so that there is something to learn.
func WriteExamples(path string, n, seqLength, vocabSize int, seed uint64) error {
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	buf := bufio.NewWriter(f)
	w := records.NewWriter(buf)
	rng := rand.New(rand.NewPCG(seed, 0))
	for range n {
		ex := features.InputFeatures{InputIDs: make([]int32, seqLength), InputMask: make([]int32, seqLength),
			SegmentIDs: make([]int32, seqLength), IsRealExample: true}
		for i := range ex.InputIDs {
			ex.InputIDs[i], ex.InputMask[i] = int32(rng.IntN(vocabSize)), 1
		}
		ex.LabelID = ex.InputIDs[1] % 2
		if err := w.Write(tfrecord.EncodeFeatures(ex)); err != nil {
			f.Close()
			return err
		}
	}
	if err := buf.Flush(); err != nil {
		f.Close()
		return err
	}
	if err := f.Close(); err != nil {
		return fmt.Errorf("synthetic: %w", err)
	}
	return nil
}
