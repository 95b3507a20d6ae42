package horovod

import (
	"fmt"
	"slices"
	"testing"
)

// variables returns n float32 variables of 256 elements (1 KiB) and one int64 scalar, each
// element a function of its index and of rank, either allocated one by one or sliced back to back
// from one flat buffer.
func variables(t *testing.T, n, rank int, flat bool) []NamedTensor {
	vars := make([]NamedTensor, 0, n+1)
	var buf []byte
	if flat {
		buf = make([]byte, n*1024+8)
	}
	for i := range n {
		v := make([]float32, 256)
		for j := range v {
			v[j] = float32(i*1000 + j + 100000*rank)
		}
		x := mustTensor(t, []int{16, 16}, v)
		if flat {
			x.Data = append(buf[i*1024:i*1024:(i+1)*1024], x.Data...)
		}
		vars = append(vars, NamedTensor{Name: fmt.Sprintf("v%d", i), Tensor: x})
	}
	step := mustTensor(t, nil, []int64{int64(7 + rank)})
	if flat {
		step.Data = append(buf[n*1024:n*1024], step.Data...)
	}
	return append(vars, NamedTensor{Name: "step", Tensor: step})
}

// BroadcastVariables fuses the variables into as few backend broadcasts as the fusion threshold
// allows, and every rank ends with the root's values, whether the variables lie apart (through
// the fusion buffer) or back to back in one buffer (broadcast where they are).
func TestBroadcastVariablesFuse(t *testing.T) {
	for _, c := range []struct {
		threshold int
		flat      bool
		calls     int64
	}{
		{DefaultFusionThreshold, false, 1},
		{DefaultFusionThreshold, true, 1},
		{4 << 10, false, 3}, // 10 KiB and 8 bytes: 4 + 4 + 2 variables and the scalar
		{0, true, 11},
	} {
		hs, g := job(t, 3, WithFusionThreshold(c.threshold))
		const root = 1
		before := g.calls["broadcast"].Load()
		onEveryRank(t, hs, func(h *Horovod) error {
			vars := variables(t, 10, h.Rank(), c.flat)
			if err := h.BroadcastVariables(vars, root); err != nil {
				return err
			}
			want := variables(t, 10, root, false)
			for i, v := range vars {
				if !slices.Equal(v.Data, want[i].Data) || !slices.Equal(v.Shape, want[i].Shape) {
					return fmt.Errorf("%s: not the root's value", v.Name)
				}
			}
			return nil
		})
		if got := g.calls["broadcast"].Load() - before; got != c.calls {
			t.Errorf("threshold %d, flat %v: %d backend broadcasts, want %d", c.threshold, c.flat, got, c.calls)
		}
	}
}

// Broadcasts from different roots, and Broadcast's new results, fuse only with their own root's.
func TestFusedBroadcastKeepsRootsApart(t *testing.T) {
	hs, g := job(t, 2)
	before := g.calls["broadcast"].Load()
	onEveryRank(t, hs, func(h *Horovod) error {
		r := float64(h.Rank())
		var hds []*Handle
		for i := range 4 {
			x := mustTensor(t, []int{2}, []float64{r, float64(i)})
			hd, err := h.BroadcastAsync(fmt.Sprintf("b%d", i), x, i%2)
			if err != nil {
				return err
			}
			hds = append(hds, hd)
		}
		for i, hd := range hds {
			got, err := hd.Wait()
			if err != nil {
				return err
			}
			if v, want := mustValues[float64](got), []float64{float64(i % 2), float64(i)}; !slices.Equal(v, want) {
				return fmt.Errorf("b%d: %v, want %v", i, v, want)
			}
		}
		return nil
	})
	// Two roots: at least two backend broadcasts, at most one per tensor.
	if got := g.calls["broadcast"].Load() - before; got < 2 || got > 4 {
		t.Errorf("%d backend broadcasts for 4 tensors from 2 roots", got)
	}
}
