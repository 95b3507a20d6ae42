package trainer

import (
	"slices"
	"strings"
	"testing"

	"github.com/gorovod/gorovod/horovod"
)

// Two ranks' gradients of a 6 x 2 table, each nonzero in the rows its batch looked up: collect
// takes each rank's rows once (a batch names row 1 twice), and sum over both ranks' gathered rows
// gives every rank the dense sum times the scale, whatever was in its own rows before.
func TestLookedUpRowsSumLikeTheAllreduce(t *testing.T) {
	ids := [][]int32{{1, 4, 1, 0}, {4, 2}}
	grads := [][]float32{
		{0.5, -1, 1, 2, 0, 0, 0, 0, 3, 4, 0, 0},
		{0, 0, 0, 0, -2, 8, 0, 0, 1, 1, 0, 0},
	}
	want := make([]float32, 12)
	for _, g := range grads {
		for i, x := range g {
			want[i] += x * 0.5
		}
	}
	var allIndices []int32
	var allValues []float32
	ranks := []*lookedUpRows{newLookedUpRows(6, 2), newLookedUpRows(6, 2)}
	for r, l := range ranks {
		// A previous step's rows must not linger.
		if err := l.collect([]int32{5, 3}, make([]float32, 12)); err != nil {
			t.Fatal(err)
		}
		if err := l.collect(ids[r], grads[r]); err != nil {
			t.Fatal(err)
		}
		allIndices = append(allIndices, l.indices...)
		allValues = append(allValues, l.values...)
	}
	if want := []int32{1, 4, 0, 4, 2}; !slices.Equal(allIndices, want) {
		t.Fatalf("collected rows %v, want %v", allIndices, want)
	}
	gi, _ := horovod.NewTensor(nil, allIndices)
	gv, _ := horovod.NewTensor([]int{len(allIndices), 2}, allValues)
	for r, l := range ranks {
		if err := l.sum(grads[r], gi, gv, 0.5); err != nil {
			t.Fatal(err)
		}
		if !slices.Equal(grads[r], want) {
			t.Errorf("rank %d: %v, want %v", r, grads[r], want)
		}
	}
}

func TestLookedUpRowsRefuseRowsOutsideTheTable(t *testing.T) {
	l := newLookedUpRows(3, 2)
	if err := l.collect([]int32{0, 3}, make([]float32, 6)); err == nil || !strings.Contains(err.Error(), "input id 3 outside the 3 rows") {
		t.Errorf("collect of id 3: %v", err)
	}
	gi, _ := horovod.NewTensor(nil, []int32{-1})
	gv, _ := horovod.NewTensor([]int{1, 2}, []float32{1, 2})
	if err := l.sum(make([]float32, 6), gi, gv, 1); err == nil || !strings.Contains(err.Error(), "index -1 outside") {
		t.Errorf("sum with index -1: %v", err)
	}
	gv, _ = horovod.NewTensor([]int{1, 1}, []float32{1})
	gi, _ = horovod.NewTensor(nil, []int32{0})
	if err := l.sum(make([]float32, 6), gi, gv, 1); err == nil || !strings.Contains(err.Error(), "with 1 indices") {
		t.Errorf("sum of a short row: %v", err)
	}
}
