package horovod

import (
	"errors"
	"fmt"
	"slices"
	"sync/atomic"
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

// A variable of directMin bytes or more is broadcast on its own, straight into its
// output, whether the variables lie apart or back to back; the small ones between them still
// fuse. The fusion buffer never grows to hold a large one (the two copies it would cost are what
// going alone saves).
func TestLargeBroadcastsGoOnTheirOwn(t *testing.T) {
	const large = directMin / 4 // float32 elements
	for _, flat := range []bool{false, true} {
		hs, g := job(t, 2)
		const root = 0
		before := g.calls["broadcast"].Load()
		onEveryRank(t, hs, func(h *Horovod) error {
			// large, small, large, small, large, small: 3 large broadcasts and one of 3 small. A
			// large one first must take no small ones along.
			sizes := []int{large, 256, large, 256, large + 1, 256}
			values := func(rank int) [][]float32 {
				out := make([][]float32, len(sizes))
				for i, n := range sizes {
					out[i] = make([]float32, n)
					for j := range out[i] {
						out[i][j] = float32(i*7 + j%1000 + 10000*rank)
					}
				}
				return out
			}
			mine := values(h.Rank())
			var buf []float32
			if flat {
				for _, v := range mine {
					buf = append(buf, v...)
				}
			}
			vars := make([]NamedTensor, len(sizes))
			off := 0
			for i, v := range mine {
				if flat {
					v = buf[off : off+len(v)]
					off += len(v)
				}
				vars[i] = NamedTensor{Name: fmt.Sprintf("v%d", i), Tensor: mustTensor(t, []int{len(v)}, v)}
			}
			if err := h.BroadcastVariables(vars, root); err != nil {
				return err
			}
			for i, want := range values(root) {
				if !slices.Equal(mustValues[float32](vars[i].Tensor), want) {
					return fmt.Errorf("%s: not the root's value", vars[i].Name)
				}
			}
			if n := len(h.ctl.fusion.buf); n >= directMin {
				return fmt.Errorf("the fusion buffer grew to %d bytes: a large variable went through it", n)
			}
			return nil
		})
		if got := g.calls["broadcast"].Load() - before; got != 4 {
			t.Errorf("flat %v: %d backend broadcasts, want 4 (3 large on their own, the 3 small fused)", flat, got)
		}
	}
}

// Broadcast returns a new tensor on every rank, the root's too: at every size, on either side of
// the size from which a broadcast never fuses, the root's result is its input's values in memory
// of its own, and its input is left as it was.
func TestBroadcastResultOnTheRoot(t *testing.T) {
	hs, _ := job(t, 3)
	const root = 1
	onEveryRank(t, hs, func(h *Horovod) error {
		for _, n := range []int{3, directMin/4 - 1, directMin / 4, 3 * directMin} {
			values := func(rank int) []float32 {
				v := make([]float32, n)
				for i := range v {
					v[i] = float32(i%4099 + 10000*rank)
				}
				return v
			}
			x := mustTensor(t, nil, values(h.Rank()))
			got, err := h.Broadcast(fmt.Sprintf("x%d", n), x, root)
			if err != nil {
				return err
			}
			if !slices.Equal(mustValues[float32](got), values(root)) {
				return fmt.Errorf("%d elements: not the root's values", n)
			}
			if &got.Data[0] == &x.Data[0] {
				return fmt.Errorf("%d elements: the result is the input", n)
			}
			if !slices.Equal(mustValues[float32](x), values(h.Rank())) {
				return fmt.Errorf("%d elements: the input changed", n)
			}
		}
		return nil
	})
}

// overlapRank is a loopback rank whose backend can leave a broadcast in flight: during runs
// while the data is being gathered, as MPI_Ibcast leaves the root's thread free.
type overlapRank struct {
	loopRank
	whiles, plain *atomic.Int64
}

func (o overlapRank) Broadcast(buf []byte, root int) error {
	o.plain.Add(1)
	return o.loopRank.Broadcast(buf, root)
}

func (o overlapRank) BroadcastWhile(buf []byte, root int, during func()) error {
	o.whiles.Add(1)
	done := make(chan error)
	go func() { done <- o.loopRank.Broadcast(buf, root) }()
	during()
	return <-done
}

// On a backend that can overlap, every rank makes a broadcast on its own with BroadcastWhile
// (MPI would never match a rank's MPI_Bcast with another's MPI_Ibcast), whether its root copies
// into a new result or broadcasts in place; the root's copy runs meanwhile and is its result.
func TestSingleBroadcastsOverlapOnEveryRank(t *testing.T) {
	g := newLoopback(3)
	whiles, plain := make([]atomic.Int64, 3), make([]atomic.Int64, 3)
	hs, errs := initRanks(g, func(r int) []Option {
		return []Option{WithBackend(overlapRank{loopRank{g, r}, &whiles[r], &plain[r]})}
	})
	if err := errors.Join(errs...); err != nil {
		t.Fatal(err)
	}
	defer func() {
		for _, h := range hs {
			h.Shutdown()
		}
	}()
	const root = 2
	values := func(n, rank int) []float32 {
		v := make([]float32, n)
		for i := range v {
			v[i] = float32(i%977 + 1000*rank)
		}
		return v
	}
	const large = directMin
	onEveryRank(t, hs, func(h *Horovod) error {
		for _, n := range []int{5, large} {
			x := mustTensor(t, nil, values(n, h.Rank()))
			got, err := h.Broadcast(fmt.Sprintf("x%d", n), x, root)
			if err != nil {
				return err
			}
			if !slices.Equal(mustValues[float32](got), values(n, root)) || &got.Data[0] == &x.Data[0] {
				return fmt.Errorf("%d elements: not a copy of the root's values", n)
			}
		}
		v := []NamedTensor{{Name: "w", Tensor: mustTensor(t, nil, values(large, h.Rank()))}}
		if err := h.BroadcastVariables(v, root); err != nil {
			return err
		}
		if !slices.Equal(mustValues[float32](v[0].Tensor), values(large, root)) {
			return errors.New("BroadcastVariables: not the root's values")
		}
		return nil
	})
	for r := range 3 {
		if w, p := whiles[r].Load(), plain[r].Load(); w != 3 || p != 0 {
			t.Errorf("rank %d: %d broadcasts with BroadcastWhile and %d plain, want 3 and 0", r, w, p)
		}
	}
}
