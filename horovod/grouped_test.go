package horovod

import (
	"fmt"
	"math"
	"slices"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/gorovod/gorovod/horovod/backend"
)

// A grouped reducescatter fuses its members into one backend reduce-scatter (one allreduce
// without one), each rank's fused block holding its block of every member, and each member's
// result is its block of its own reduction: members of different row counts and row sizes, one
// with fewer rows than ranks (empty blocks on the last ranks), with every op and scale factor.
// A threshold that holds two of the three members splits the group into two calls.
func TestGroupedReducescatterFuses(t *testing.T) {
	const size = 3
	shapes := [][]int{{7, 2}, {4, 3}, {2, 1}}
	input := func(member int) func(rank, i int) float64 {
		return func(rank, i int) float64 { return float64((rank+1)*((i+member)%5+1)) - 2 }
	}
	for _, tc := range []struct {
		native    bool
		threshold int
		calls     int64 // backend calls per group on each rank
	}{
		{true, 64 << 20, 1}, {false, 64 << 20, 1},
		{true, (7*2 + 4*3) * 8, 2}, {false, (7*2 + 4*3) * 8, 2},
	} {
		hs, g, reduceScatters, _ := exchangeJob(t, size, tc.native, WithFusionThreshold(tc.threshold))
		for _, o := range []ReducescatterOptions{
			{Op: Sum}, {Op: Average}, {Op: Min}, {Op: Max}, {Op: Product},
			{Op: Average, Prescale: 0.5, Postscale: 3},
		} {
			before := reduceScatters.Load()
			allreduces := g.calls["allreduce"].Load()
			onEveryRank(t, hs, func(h *Horovod) error {
				members := make([]NamedTensor, len(shapes))
				for m, shape := range shapes {
					in := make([]float64, shape[0]*shape[1])
					for i := range in {
						in[i] = input(m)(h.Rank(), i)
					}
					members[m] = NamedTensor{fmt.Sprintf("rs%d/%v/%v", m, o.Op, o.Prescale), mustTensor(t, shape, in)}
				}
				outs, err := h.GroupedReducescatter(members, o)
				if err != nil {
					return err
				}
				for m, shape := range shapes {
					rows := scatterRows(shape[0], size, h.Rank())
					if !slices.Equal(outs[m].Shape, []int{rows, shape[1]}) {
						return fmt.Errorf("member %d: shape %v", m, outs[m].Shape)
					}
					first := 0
					for k := range h.Rank() {
						first += scatterRows(shape[0], size, k) * shape[1]
					}
					want := reduction(o, size, input(m), first, rows*shape[1])
					for i, got := range mustValues[float64](outs[m]) {
						if math.Abs(got-want[i]) > 1e-12*math.Max(1, math.Abs(want[i])) {
							return fmt.Errorf("%+v: member %d, element %d of its block: %v, want %v", o, m, i, got, want[i])
						}
					}
				}
				return nil
			})
			got := g.calls["allreduce"].Load() - allreduces
			if tc.native {
				got = (reduceScatters.Load() - before) / size
			}
			if got != tc.calls {
				t.Errorf("native=%v, threshold %d, %+v: %d backend calls, want %d", tc.native, tc.threshold, o, got, tc.calls)
			}
		}
	}
}

// Reducescatters and allgathers fuse as broadcasts do: a member of directMin bytes or more (an
// allgather's by its result) goes on its own, straight from its input into its output, and a
// batch takes members only while it holds less than directMin (through the fusion buffer the
// copies cost more than calls of their own). Each member's result is still its own.
func TestFusionStopsAtDirectMin(t *testing.T) {
	const third = directMin/(3*16) + 1 // rows of 16 bytes: three reach directMin, two do not (an even number)
	for _, c := range []struct {
		what  string
		rows  []int // each member's rows of 2 float64 (its bytes for a reducescatter; every rank's for an allgather, of 2 ranks)
		calls int64
		small bool // the fused batches are small: the fusion buffer stays below directMin
	}{
		// The second alone; the first and third fuse.
		{"large member", []int{3, directMin / 16, 5}, 2, true},
		// Just over thirds of directMin: the first three fuse, reaching directMin; the fourth goes apart.
		{"thirds", []int{third, third, third, third}, 2, false},
	} {
		for _, gather := range []bool{false, true} {
			var allgathers atomic.Int64
			var reduceScatters atomic.Int64
			hs, _ := job(t, 2, WithDataBackend(func(control backend.Backend) (backend.Backend, error) {
				return nativeExchange{dataGathers{control, &allgathers}, &reduceScatters, &atomic.Int64{}}, nil
			}))
			input := func(member int) func(rank, i int) float64 {
				return func(rank, i int) float64 { return float64(rank + 1 + i%7 + member) }
			}
			onEveryRank(t, hs, func(h *Horovod) error {
				members := make([]NamedTensor, len(c.rows))
				for m, rows := range c.rows {
					if gather {
						rows /= 2 // each rank's half of the result
					}
					in := make([]float64, rows*2)
					for i := range in {
						in[i] = input(m)(h.Rank(), i)
					}
					members[m] = NamedTensor{fmt.Sprintf("m%d", m), mustTensor(t, []int{rows, 2}, in)}
				}
				if gather {
					outs, err := h.GroupedAllgather(members)
					if err != nil {
						return err
					}
					for m := range members {
						n := len(members[m].Data) / 8
						want := append(reduction(ReducescatterOptions{Op: Min}, 1, func(_, i int) float64 { return input(m)(0, i) }, 0, n),
							reduction(ReducescatterOptions{Op: Min}, 1, func(_, i int) float64 { return input(m)(1, i) }, 0, n)...)
						if got := mustValues[float64](outs[m]); !slices.Equal(got, want) {
							return fmt.Errorf("allgather member %d: %v..., want %v...", m, got[:min(4, len(got))], want[:min(4, len(want))])
						}
					}
					return nil
				}
				outs, err := h.GroupedReducescatter(members, ReducescatterOptions{Op: Sum})
				if err != nil {
					return err
				}
				for m, rows := range c.rows {
					first := 0
					for k := range h.Rank() {
						first += scatterRows(rows, 2, k) * 2
					}
					want := reduction(ReducescatterOptions{Op: Sum}, 2, input(m), first, scatterRows(rows, 2, h.Rank())*2)
					if got := mustValues[float64](outs[m]); !slices.Equal(got, want) {
						return fmt.Errorf("reducescatter member %d: %v..., want %v...", m, got[:min(4, len(got))], want[:min(4, len(want))])
					}
				}
				return nil
			})
			for _, h := range hs {
				// A large member goes straight from its input into its output, never through the
				// fusion buffer.
				if n := len(h.ctl.fusion.buf); c.small && n >= directMin {
					t.Errorf("%s, allgather %v: rank %d's fusion buffer grew to %d bytes", c.what, gather, h.Rank(), n)
				}
			}
			got := reduceScatters.Load() / 2
			if gather {
				got = allgathers.Load() / 2
			}
			if got != c.calls {
				t.Errorf("%s, allgather %v: %d backend calls on each rank, want %d", c.what, gather, got, c.calls)
			}
		}
	}
}

// Members of different dtypes do not fuse, but still move in the same round; a rank that has
// joined takes part in the others' grouped reducescatters with zeros.
func TestGroupedReducescatterOfDtypesAndWithJoin(t *testing.T) {
	for _, native := range []bool{true, false} {
		hs, _, reduceScatters, _ := exchangeJob(t, 3, native)
		onEveryRank(t, hs, func(h *Horovod) error {
			if h.Rank() == 2 {
				_, err := h.Join()
				return err
			}
			f := mustTensor(t, []int{3}, []float32{float32(h.Rank() + 1), 10, 100})
			i := mustTensor(t, []int{3, 1}, []int32{int32(h.Rank() + 1), 20, 200})
			outs, err := h.GroupedReducescatter([]NamedTensor{{"f", f}, {"i", i}}, ReducescatterOptions{Op: Sum})
			if err != nil {
				return err
			}
			wantF, wantI := [][]float32{{3}, {20}}[h.Rank()], [][]int32{{3}, {40}}[h.Rank()]
			if got := mustValues[float32](outs[0]); !slices.Equal(got, wantF) {
				return fmt.Errorf("f: %v, want %v", got, wantF)
			}
			if got := mustValues[int32](outs[1]); !slices.Equal(got, wantI) || !slices.Equal(outs[1].Shape, []int{1, 1}) {
				return fmt.Errorf("i: %v%v, want %v", got, outs[1].Shape, wantI)
			}
			_, err = h.Join()
			return err
		})
		if native && reduceScatters.Load() != 2*3 {
			t.Errorf("%d backend reduce-scatters, want one per dtype on each of 3 ranks", reduceScatters.Load())
		}
	}
}

// A grouped allgather gathers its members in one backend call, each member's result its own
// rows of every rank in rank order, a joined rank contributing none; the ranks' first
// dimensions differ.
func TestGroupedAllgather(t *testing.T) {
	var allgathers atomic.Int64 // the data backend's, not the negotiation's
	hs, _ := job(t, 3, WithDataBackend(func(control backend.Backend) (backend.Backend, error) {
		return dataGathers{control, &allgathers}, nil
	}))
	row := func(member, rank, j int) int32 { return int32(100*member + 10*rank + j) }
	gather := func(h *Horovod, present []int) error {
		members := make([]NamedTensor, 2)
		for m := range members {
			rows := h.Rank() + m // rank 0's first member has no rows
			in := make([]int32, 2*rows)
			for j := range rows {
				in[2*j], in[2*j+1] = row(m, h.Rank(), j), -row(m, h.Rank(), j)
			}
			members[m] = NamedTensor{fmt.Sprintf("g%d", m), mustTensor(t, []int{rows, 2}, in)}
		}
		outs, err := h.GroupedAllgather(members)
		if err != nil {
			return err
		}
		for m, out := range outs {
			var want []int32
			for _, r := range present {
				for j := range r + m {
					want = append(want, row(m, r, j), -row(m, r, j))
				}
			}
			if got := mustValues[int32](out); !slices.Equal(got, want) || out.Shape[0] != len(want)/2 {
				return fmt.Errorf("member %d: %v%v, want %v", m, got, out.Shape, want)
			}
		}
		return nil
	}
	onEveryRank(t, hs, func(h *Horovod) error { return gather(h, []int{0, 1, 2}) })
	if got := allgathers.Load(); got != 3 {
		t.Errorf("%d backend allgathers for a group of two on 3 ranks, want 3", got)
	}
	onEveryRank(t, hs, func(h *Horovod) error {
		if h.Rank() == 1 {
			_, err := h.Join()
			return err
		}
		if err := gather(h, []int{0, 2}); err != nil {
			return err
		}
		_, err := h.Join()
		return err
	})
}

// Grouped allgathers and reducescatters match across ranks as grouped allreduces do: different
// members fail on every rank, naming each rank's; a reducescatter's Output is a single tensor's.
func TestGroupedAllgatherAndReducescatterErrors(t *testing.T) {
	hs, _ := job(t, 2)
	x := mustTensor(t, []int{2}, []float32{1, 2})
	errs := make([]error, 2)
	onEveryRankWithin(t, hs, "allgather groups of different members", func(h *Horovod) error {
		ts := []NamedTensor{{"p", x}, {"q", x}}
		if h.Rank() == 1 {
			ts[1].Name = "r"
		}
		_, errs[h.Rank()] = h.GroupedAllgather(ts)
		return nil
	})
	for r, err := range errs {
		if err == nil || !strings.Contains(err.Error(), "ranks grouped different tensors in group.1: rank 0: [p q]; rank 1: [p r]") {
			t.Errorf("rank %d: %v", r, err)
		}
	}
	onEveryRankWithin(t, hs, "a grouped reducescatter against a grouped allreduce", func(h *Horovod) error {
		ts := []NamedTensor{{"s", x}}
		if h.Rank() == 0 {
			_, errs[0] = h.GroupedReducescatter(ts, ReducescatterOptions{})
		} else {
			_, errs[1] = h.GroupedAllreduce(ts, AllreduceOptions{})
		}
		return nil
	})
	for r, err := range errs {
		if err == nil || !strings.Contains(err.Error(), "mismatched operations") {
			t.Errorf("rank %d: %v", r, err)
		}
	}
	_, err := hs[0].GroupedReducescatter([]NamedTensor{{"o", x}}, ReducescatterOptions{Output: make([]byte, 4)})
	if err == nil || !strings.Contains(err.Error(), "Output is for a single tensor's reducescatter, not a group's") {
		t.Errorf("Output in a group: %v", err)
	}
	onEveryRank(t, hs, func(h *Horovod) error { return h.Barrier() })
}
