package bertgraph

import (
	"github.com/gorovod/gorovod/bertgraph/features"
)

// EvalStats are eval_step's sums for one batch; add them over batches (and ranks), then
// Loss = LossSum / Examples and accuracy = Correct / Examples, as run_classifier reports them.
type EvalStats struct {
	LossSum           float64
	Correct, Examples int
}

// Add accumulates o into e.
func (e *EvalStats) Add(o EvalStats) {
	e.LossSum += o.LossSum
	e.Correct += o.Correct
	e.Examples += o.Examples
}

// Eval runs eval_step (no dropout) on batch; padding examples (IsRealExample 0) do not count.
// It feeds tensors of its own: calls may run concurrently (with each other and Predict).
func (m *Model) Eval(batch *features.Batch) (EvalStats, error) {
	s := m.sigs[SigEvalStep]
	feeds, in, err := newFeeds(batch, m.contract, s, true)
	if err != nil {
		return EvalStats{}, err
	}
	defer in.close()
	out, err := s.run(m.sm.Session, feeds, m.evalFetches)
	if err != nil {
		return EvalStats{}, err
	}
	defer closeAll(out)
	loss, err := scalarValue[float32](out[0], "eval_step loss_sum")
	if err != nil {
		return EvalStats{}, err
	}
	correct, err := scalarValue[int32](out[1], "eval_step correct")
	if err != nil {
		return EvalStats{}, err
	}
	examples, err := scalarValue[int32](out[2], "eval_step examples")
	return EvalStats{float64(loss), int(correct), int(examples)}, err
}

// Predictions are a batch's class probabilities and logits, row-major [examples x labels].
type Predictions struct {
	NumLabels             int
	Probabilities, Logits []float32
}

// Row returns example i's probabilities.
func (p *Predictions) Row(i int) []float32 {
	return p.Probabilities[i*p.NumLabels : (i+1)*p.NumLabels]
}

// Predict runs predict (no dropout) on batch's features; labels are not needed. Like Eval, it
// feeds tensors of its own and may run concurrently.
func (m *Model) Predict(batch *features.Batch) (*Predictions, error) {
	s := m.sigs[SigPredict]
	feeds, in, err := newFeeds(batch, m.contract, s, false)
	if err != nil {
		return nil, err
	}
	defer in.close()
	return runPredict(m.sm.Session, s, feeds, m.contract.NumLabels, batch.BatchSize)
}
