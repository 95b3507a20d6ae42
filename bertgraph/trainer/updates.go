package trainer

import (
	"fmt"
	"math"

	"github.com/gorovod/gorovod/bertgraph"
	"github.com/gorovod/gorovod/horovod"
)

// adasumUpdates combines the ranks' weight updates instead of their gradients
// (Options.AdasumUpdates): every rank takes an AdamWeightDecay step of its own on its own
// gradients, with its own slots, and the ranks then agree on the weights before it plus the
// Adasum of the changes, as Horovod's DistributedOptimizer(op=hvd.Adasum) does with a TensorFlow 1
// optimizer. Adam divides each gradient by its own running scale, so the sizes Adasum weighs are
// those of the steps the optimizer takes, the setting of the Adasum paper.
type adasumUpdates struct {
	model  *bertgraph.Model
	before *bertgraph.FlatTensors // the weights before this rank's own step
}

// skips reports whether Apply would skip the step of grads times scale: a value not finite, or
// a global norm past float32. The ranks agree on it before any of them applies (a rank that
// applied alone would hold other weights and another global step than the rest).
func (u *adasumUpdates) skips(grads []float32, scale float32) bool {
	var sum float64
	for _, g := range grads {
		sum += float64(g) * float64(g)
	}
	return !(math.Sqrt(sum)*float64(scale) <= math.MaxFloat32)
}

// step applies this rank's own step to grads (its gradients, scaled by scale) and replaces the
// weights by the ones before it plus the Adasum of every rank's change, computed in grads through
// named (views of it) by reducer. grads holds the combined change afterwards. Applied is false,
// and nothing has changed, only when the ranks agreed to skip.
func (u *adasumUpdates) step(grads *bertgraph.FlatTensors, named []horovod.NamedTensor, reducer *horovod.Reducer,
	scale, lr, clip float32, rank int, phases *Phases, clock *phaseClock) (bertgraph.ApplyResult, error) {
	if err := u.model.ReadVariables(u.before); err != nil {
		return bertgraph.ApplyResult{}, err
	}
	res, err := u.model.Apply(grads, scale, lr, clip)
	if err != nil {
		return res, err
	}
	if !res.Applied {
		return res, fmt.Errorf("trainer: rank %d skipped its own step (global norm %v) after the ranks agreed its gradients were finite", rank, res.GlobalNorm)
	}
	if err := u.model.ReadVariables(grads); err != nil {
		return res, err
	}
	subtract(grads.Data, u.before.Data)
	clock.lap(&phases.Apply)
	if _, _, err := reducer.Reduce(named); err != nil {
		return res, err
	}
	clock.lap(&phases.Allreduce)
	addInto(u.before.Data, grads.Data)
	return res, u.model.AssignVariables(u.before)
}

// subtract takes src from dst, element by element.
func subtract(dst, src []float32) {
	src = src[:len(dst)]
	for i, v := range src {
		dst[i] -= v
	}
}
