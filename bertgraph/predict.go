package bertgraph

import (
	"fmt"

	"github.com/gorovod/gorovod/tf"
)

// runPredict runs a predict-shaped signature with feeds and reads its outputs.
func runPredict(sess *tf.Session, s *signature, feeds map[tf.Output]*tf.Tensor, numLabels, batchSize int) (*Predictions, error) {
	out, err := sess.Run(feeds, s.fetches("probabilities", "logits"), nil)
	if err != nil {
		return nil, fmt.Errorf("bertgraph: signature %q: %w", s.key, err)
	}
	defer closeAll(out)
	p := &Predictions{NumLabels: numLabels}
	if p.Probabilities, err = out[0].Float32s(); err != nil {
		return nil, fmt.Errorf("bertgraph: %s probabilities: %w", s.key, err)
	}
	if p.Logits, err = out[1].Float32s(); err != nil {
		return nil, fmt.Errorf("bertgraph: %s logits: %w", s.key, err)
	}
	if want := batchSize * numLabels; len(p.Probabilities) != want || len(p.Logits) != want {
		return nil, fmt.Errorf("bertgraph: %s returned %d probabilities and %d logits, want %d",
			s.key, len(p.Probabilities), len(p.Logits), want)
	}
	return p, nil
}
