package trainer

import (
	"fmt"

	"github.com/gorovod/gorovod/horovod"
)

// lookedUpRows carries the word embeddings' gradient between the ranks as the rows the step's
// batch looked up, the way Horovod allgathers an IndexedSlices gradient (its default,
// sparse_as_dense=False), instead of in the dense allreduce: a batch of 16 x 128 tokens names at
// most 2,048 of MiniLM's 30,522 rows (IMDB's: 700-800), so about 1.2 MB per rank travels instead
// of 47 MB, half of the model's gradients. The sums are the same: every other row of every rank's
// gradient is exactly zero (bertgraph.Model.LookedUpRows), so adding the gathered rows into a
// zeroed gradient is the allreduce's sum with the zeros left out. The rows travel as float32
// whatever the allreduce's compression: they are too few for it to matter.
type lookedUpRows struct {
	rows, width int
	seen        []bool    // per vocabulary row: in this step's indices
	indices     []int32   // this step's rows, in the order the batch first names them
	values      []float32 // their gradients, len(indices) x width
}

func newLookedUpRows(rows, width int) *lookedUpRows {
	return &lookedUpRows{rows: rows, width: width, seen: make([]bool, rows)}
}

// collect takes the rows inputIDs name out of grad (rows x width, this rank's gradient) into
// indices and values, reused from step to step.
func (l *lookedUpRows) collect(inputIDs []int32, grad []float32) error {
	for _, r := range l.indices {
		l.seen[r] = false
	}
	l.indices, l.values = l.indices[:0], l.values[:0]
	for _, id := range inputIDs {
		if id < 0 || int(id) >= l.rows {
			return fmt.Errorf("input id %d outside the %d rows of the word embeddings", id, l.rows)
		}
		if !l.seen[id] {
			l.seen[id] = true
			l.indices = append(l.indices, id)
			l.values = append(l.values, grad[int(id)*l.width:(int(id)+1)*l.width]...)
		}
	}
	return nil
}

// tensors views this step's indices and values as horovod tensors, for the allgathers.
func (l *lookedUpRows) tensors() (indices, values horovod.Tensor) {
	indices, _ = horovod.NewTensor([]int{len(l.indices)}, l.indices)
	values, _ = horovod.NewTensor([]int{len(l.indices), l.width}, l.values)
	return indices, values
}

// sum makes grad the sum over the ranks times scale: it zeroes the rows this rank collected, the
// only nonzero ones, then adds every rank's gathered rows times scale, in rank order (a row
// several ranks looked up gets each one's values). scale puts the sum on the Reducer's footing:
// 1 for its sums (DeferAverage), 1/size for its averages (compression).
func (l *lookedUpRows) sum(grad []float32, gatheredIndices, gatheredValues horovod.Tensor, scale float32) error {
	indices, err := horovod.Values[int32](gatheredIndices)
	if err != nil {
		return err
	}
	values, err := horovod.Values[float32](gatheredValues)
	if err != nil {
		return err
	}
	if len(values) != len(indices)*l.width {
		return fmt.Errorf("gathered %d rows of the word embeddings' gradient with %d indices", len(values)/max(1, l.width), len(indices))
	}
	for _, r := range indices {
		if r < 0 || int(r) >= l.rows {
			return fmt.Errorf("a gathered row index %d outside the %d rows of the word embeddings", r, l.rows)
		}
	}
	for _, r := range l.indices {
		clear(grad[int(r)*l.width : (int(r)+1)*l.width])
	}
	for i, r := range indices {
		row := grad[int(r)*l.width : (int(r)+1)*l.width]
		for k, x := range values[i*l.width : (i+1)*l.width] {
			row[k] += x * scale
		}
	}
	return nil
}
