package bertgraph

import (
	"encoding/json"
	"math/rand/v2"

	"github.com/gorovod/gorovod/bertgraph/features"
)

// SyntheticBatch is a training batch of n examples for benchmarks, the batch of drive.py's
// bench: random token ids (the same on every call), full masks, one segment, random labels.
func SyntheticBatch(m *Model, n int) *features.Batch {
	var cfg struct {
		VocabSize int `json:"vocab_size"`
	}
	if err := json.Unmarshal(m.Contract().BertConfig, &cfg); err != nil || cfg.VocabSize < 6 {
		cfg.VocabSize = 6
	}
	rng := rand.New(rand.NewPCG(0, 0))
	s := m.MaxSeqLength()
	b := features.NewBatch(n, s)
	for i := range b.InputIDs {
		b.InputIDs[i] = 5 + int32(rng.IntN(cfg.VocabSize-5))
		b.InputMask[i] = 1
	}
	for i := range n {
		b.LabelIDs[i] = int32(rng.IntN(m.NumLabels()))
		b.IsRealExample[i] = 1
	}
	return b
}
