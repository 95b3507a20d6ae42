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

// nativeExchange is a data backend with a reduce-scatter and an all-to-all of its own, each
// computed in Go out of one allgather of every rank's whole input (so its results do not come
// from the code under test), counting its calls. Without it, the loopback has neither and
// horovod falls back to Allreduce and Allgatherv.
type nativeExchange struct {
	backend.Backend
	reduceScatters, alltoalls *atomic.Int64
}

func (n nativeExchange) everyRanks(send []byte) ([][]byte, error) {
	size := n.Topology().Size
	counts := make([]int, size)
	for r := range counts {
		counts[r] = len(send) // only alike on every rank for a reduce-scatter: see Alltoallv
	}
	all := make([]byte, size*len(send))
	if err := n.Backend.Allgatherv(send, all, counts); err != nil {
		return nil, err
	}
	parts := make([][]byte, size)
	for r := range parts {
		parts[r] = all[r*len(send) : (r+1)*len(send)]
	}
	return parts, nil
}

func (n nativeExchange) ReduceScatter(send, recv []byte, counts []int, dt backend.DType, op backend.ReduceOp) error {
	n.reduceScatters.Add(1)
	parts, err := n.everyRanks(send)
	if err != nil {
		return err
	}
	rank := n.Topology().Rank
	first := 0
	for _, c := range counts[:rank] {
		first += c
	}
	first /= dt.Size()
	for i := range len(recv) / dt.Size() {
		acc := element(parts[0], dt, first+i)
		for _, p := range parts[1:] {
			acc = combine(op, acc, element(p, dt, first+i))
		}
		setElement(recv, dt, i, acc)
	}
	return nil
}

// Alltoallv gathers every rank's send counts first (the inputs' lengths differ between ranks),
// then every input, and keeps the blocks for this rank.
func (n nativeExchange) Alltoallv(send []byte, sendCounts []int, recv []byte, recvCounts []int) error {
	n.alltoalls.Add(1)
	size, rank := n.Topology().Size, n.Topology().Rank
	mine := make([]byte, 8*size)
	for r, c := range sendCounts {
		view[int64](mine)[r] = int64(c)
	}
	everyCounts, err := n.everyRanks(mine)
	if err != nil {
		return err
	}
	lengths := make([]int, size)
	offsets := make([][]int, size) // of each rank's block for each rank
	total := 0
	for r, b := range everyCounts {
		for _, c := range view[int64](b) {
			offsets[r] = append(offsets[r], lengths[r])
			lengths[r] += int(c)
		}
		total += lengths[r]
	}
	all := make([]byte, total)
	if err := n.Backend.Allgatherv(send, all, lengths); err != nil {
		return err
	}
	at, written := 0, 0
	for r := range size {
		from := at + offsets[r][rank]
		written += copy(recv[written:], all[from:from+recvCounts[r]])
		at += lengths[r]
	}
	return nil
}

// exchangeJob starts size ranks whose data backend has its own reduce-scatter and all-to-all
// (native) or not, returning the counters of the native calls and of the loopback's.
func exchangeJob(t *testing.T, size int, native bool, opts ...Option) ([]*Horovod, *loopback, *atomic.Int64, *atomic.Int64) {
	t.Helper()
	var reduceScatters, alltoalls atomic.Int64
	if native {
		opts = append(opts, WithDataBackend(func(control backend.Backend) (backend.Backend, error) {
			return nativeExchange{control, &reduceScatters, &alltoalls}, nil
		}))
	}
	hs, g := job(t, size, opts...)
	return hs, g, &reduceScatters, &alltoalls
}

// Reducescatter leaves each rank its block of the reduction: 7 rows over 3 ranks are 3, 2 and 2
// (Horovod gives the first rows%size ranks the extra row), each the rows' reduction over the
// ranks' inputs as computed here, with Average's division and the scale factors, through the
// backend's reduce-scatter where it has one and an allreduce where it has not.
func TestReducescatter(t *testing.T) {
	const size, rows, cols = 3, 7, 2
	input := func(rank, i int) float64 { return float64((rank+1)*(i%5+1)) - 2 }
	wantRows := []int{3, 2, 2}
	for _, native := range []bool{true, false} {
		hs, g, reduceScatters, _ := exchangeJob(t, size, native)
		for _, o := range []ReducescatterOptions{
			{Op: Sum}, {Op: Average}, {Op: Min}, {Op: Max}, {Op: Product},
			{Op: Average, Prescale: 0.5, Postscale: 3},
		} {
			allreduces := g.calls["allreduce"].Load()
			name := fmt.Sprintf("rs/%v/%v/%v", native, o.Op, o.Prescale)
			onEveryRank(t, hs, func(h *Horovod) error {
				in := make([]float64, rows*cols)
				for i := range in {
					in[i] = input(h.Rank(), i)
				}
				out, err := h.Reducescatter(name, mustTensor(t, []int{rows, cols}, in), o)
				if err != nil {
					return err
				}
				if !slices.Equal(out.Shape, []int{wantRows[h.Rank()], cols}) {
					return fmt.Errorf("shape %v", out.Shape)
				}
				first := 0
				for _, n := range wantRows[:h.Rank()] {
					first += n * cols
				}
				want := reduction(o, size, input, first, len(out.Data)/8)
				for i, got := range mustValues[float64](out) {
					// Every value is a small integer, a half or a third of one, scaled by 3:
					// exact up to the one rounding of the division.
					if math.Abs(got-want[i]) > 1e-12*math.Max(1, math.Abs(want[i])) {
						return fmt.Errorf("%+v: element %d of its block: %v, want %v", o, i, got, want[i])
					}
				}
				return nil
			})
			if got := g.calls["allreduce"].Load() - allreduces; native && got != 0 || !native && got != 1 {
				t.Errorf("native=%v %+v: %d loopback allreduces", native, o, got)
			}
		}
		if native && reduceScatters.Load() != 6*size {
			t.Errorf("%d reduce-scatters of the backend's, want %d", reduceScatters.Load(), 6*size)
		}
	}
}

// reduction returns elements first to first+n of the reduction o makes of size ranks' inputs,
// input(rank, i) the i-th element of rank's, computed here in float64.
func reduction(o ReducescatterOptions, size int, input func(rank, i int) float64, first, n int) []float64 {
	pre, post := scaleFactors(o.Prescale, o.Postscale)
	out := make([]float64, n)
	for i := range out {
		want := pre * input(0, first+i)
		for r := 1; r < size; r++ {
			v := pre * input(r, first+i)
			switch o.Op {
			case Sum, Average:
				want += v
			case Min:
				want = math.Min(want, v)
			case Max:
				want = math.Max(want, v)
			case Product:
				want *= v
			}
		}
		if o.Op == Average {
			want /= float64(size)
		}
		out[i] = want * post
	}
	return out
}

// A rank that has joined contributes zeros to the others' reducescatters, as to their
// allreduces; fewer rows than ranks leave the last ranks empty blocks.
func TestReducescatterWithJoin(t *testing.T) {
	for _, native := range []bool{true, false} {
		hs, _, _, _ := exchangeJob(t, 3, native)
		onEveryRank(t, hs, func(h *Horovod) error {
			if h.Rank() == 2 {
				_, err := h.Join()
				return err
			}
			in := []int32{int32(h.Rank() + 1), 10, 100, 1000}
			out, err := h.Reducescatter("rs", mustTensor(t, []int{2, 2}, in), ReducescatterOptions{Op: Sum})
			if err != nil {
				return err
			}
			want := [][]int32{{3, 20}, {200, 2000}}[h.Rank()]
			if got := mustValues[int32](out); !slices.Equal(got, want) || !slices.Equal(out.Shape, []int{1, 2}) {
				return fmt.Errorf("%v%v, want %v", got, out.Shape, want)
			}
			if _, err := h.Join(); err != nil {
				return err
			}
			return nil
		})
	}
}

// Alltoall sends each rank the rows its splits give it and returns the rows every rank sent
// this one in rank order, with how many came from each, whether the ranks send different
// numbers of rows (none to some ranks) or split evenly (nil splits).
func TestAlltoall(t *testing.T) {
	const size, cols = 3, 2
	splitsOf := func(rank int) []int { return [][]int{{1, 0, 2}, {2, 2, 0}, {0, 1, 3}}[rank] }
	// Row j of rank from's block for rank to holds (from, to, j) in its columns.
	value := func(from, to, j, col int) int32 { return int32(from*1000 + to*100 + j*10 + col) }
	for _, native := range []bool{true, false} {
		hs, g, _, alltoalls := exchangeJob(t, size, native)
		gathers := g.calls["allgatherv"].Load()
		for _, even := range []bool{false, true} {
			onEveryRank(t, hs, func(h *Horovod) error {
				splits := splitsOf(h.Rank())
				if even {
					splits = []int{2, 2, 2}
				}
				var in []int32
				for to, n := range splits {
					for j := range n {
						for col := range cols {
							in = append(in, value(h.Rank(), to, j, col))
						}
					}
				}
				var give []int
				if !even {
					give = splits
				}
				out, received, err := h.Alltoall(fmt.Sprintf("a2a/%v", even), mustTensor(t, []int{len(in) / cols, cols}, in), give)
				if err != nil {
					return err
				}
				var want []int32
				var wantReceived []int
				for from := range size {
					n := splitsOf(from)[h.Rank()]
					if even {
						n = 2
					}
					wantReceived = append(wantReceived, n)
					for j := range n {
						for col := range cols {
							want = append(want, value(from, h.Rank(), j, col))
						}
					}
				}
				if got := mustValues[int32](out); !slices.Equal(got, want) || !slices.Equal(out.Shape, []int{len(want) / cols, cols}) {
					return fmt.Errorf("even=%v: %v%v, want %v", even, got, out.Shape, want)
				}
				if !slices.Equal(received, wantReceived) {
					return fmt.Errorf("received splits %v, want %v", received, wantReceived)
				}
				return nil
			})
		}
		if native && alltoalls.Load() != 2*size {
			t.Errorf("%d all-to-alls of the backend's, want %d", alltoalls.Load(), 2*size)
		}
		// The fallback gathers each alltoall's inputs once; the native one twice (counts, then
		// data) through the loopback.
		wantGathers := int64(2)
		if native {
			wantGathers = 4
		}
		if got := g.calls["allgatherv"].Load() - gathers; got < wantGathers {
			t.Errorf("native=%v: %d loopback allgathers, want at least %d", native, got, wantGathers)
		}
	}
}

// AlltoallAsync's handle gives the received splits once it completes.
func TestAlltoallAsyncReceivedSplits(t *testing.T) {
	hs, _, _, _ := exchangeJob(t, 2, true)
	onEveryRank(t, hs, func(h *Horovod) error {
		in := []float32{1, 2, 3}
		splits := [][]int{{1, 2}, {0, 3}}[h.Rank()]
		hd, err := h.AlltoallAsync("a2a", mustTensor(t, []int{3}, in), splits)
		if err != nil {
			return err
		}
		out, err := hd.Wait()
		if err != nil {
			return err
		}
		want := [][]int{{1, 0}, {2, 3}}[h.Rank()]
		if got := hd.ReceivedSplits(); !slices.Equal(got, want) || out.Shape[0] != want[0]+want[1] {
			return fmt.Errorf("received splits %v, shape %v, want %v", got, out.Shape, want)
		}
		return nil
	})
}

// Mistakes a rank can see alone fail at once; those across ranks fail on every rank, naming
// what differs: shapes beyond the first dimension, a rank that has joined an alltoall.
func TestReducescatterAndAlltoallErrors(t *testing.T) {
	hs, _, _, _ := exchangeJob(t, 2, true)
	h := hs[0]
	x := mustTensor(t, []int{3, 2}, []float32{1, 2, 3, 4, 5, 6})
	scalar := mustTensor(t, []int{}, []float32{1})
	for _, c := range []struct {
		err  error
		want string
	}{
		{func() error { _, err := h.Reducescatter("s", scalar, ReducescatterOptions{}); return err }(), "a scalar has no first dimension to scatter along"},
		{func() error { _, err := h.Reducescatter("s", x, ReducescatterOptions{Op: Adasum + 1}); return err }(), "unknown reduce op"},
		{func() error { _, err := h.Reducescatter("s", x, ReducescatterOptions{Op: Adasum}); return err }(), "Adasum is an allreduce's op only"},
		{func() error { _, _, err := h.Alltoall("a", scalar, nil); return err }(), "a scalar has no first dimension to split along"},
		{func() error { _, _, err := h.Alltoall("a", x, nil); return err }(), "the first dimension 3 does not split evenly among 2 ranks"},
		{func() error { _, _, err := h.Alltoall("a", x, []int{1, 1}); return err }(), "splits [1 1] sum to 2 rows, not the first dimension 3"},
		{func() error { _, _, err := h.Alltoall("a", x, []int{3}); return err }(), "1 splits for 2 ranks"},
		{func() error { _, _, err := h.Alltoall("a", x, []int{-1, 4}); return err }(), "do not divide the first dimension 3"},
	} {
		if c.err == nil || !strings.Contains(c.err.Error(), c.want) {
			t.Errorf("got %v, want %q", c.err, c.want)
		}
	}
	var errs [2]error
	onEveryRank(t, hs, func(h *Horovod) error {
		in := mustTensor(t, []int{2, 1 + h.Rank()}, make([]float32, 2+2*h.Rank()))
		_, _, errs[h.Rank()] = h.Alltoall("mismatch", in, nil)
		return nil
	})
	for r, err := range errs {
		if err == nil || !strings.Contains(err.Error(), "mismatched shapes beyond the first dimension: [1] on rank 0; [2] on rank 1") {
			t.Errorf("rank %d: %v", r, err)
		}
	}
	onEveryRank(t, hs, func(h *Horovod) error {
		if h.Rank() == 1 {
			_, err := h.Join()
			return err
		}
		_, _, errs[0] = h.Alltoall("joined", x, []int{3, 0})
		_, err := h.Join()
		return err
	})
	if errs[0] == nil || !strings.Contains(errs[0].Error(), "alltoall does not take part in Join: rank(s) 1 have joined") {
		t.Errorf("alltoall with a joined rank: %v", errs[0])
	}
}

// The backend's all-to-all takes an alltoall only where every rank's counts and offsets fit
// MPI's C ints: past them on one rank, every rank takes the allgather, having seen all splits.
func TestAlltoallFitsCInts(t *testing.T) {
	const half = 1 << 30 // 2^30 rows of one byte
	for _, c := range []struct {
		splits [][]int
		row    int
		want   bool
	}{
		{[][]int{{1, 2}, {3, 4}}, 8, true},
		{[][]int{{half - 1, half}, {0, 0}}, 1, true},          // rank 0 sends 2^31-1 bytes
		{[][]int{{half, half}, {0, 0}}, 1, false},             // 2^31: its second block's end
		{[][]int{{0, half}, {0, half}}, 1, false},             // rank 1 receives 2^31
		{[][]int{{0, math.MaxInt32}, {0, 0}}, 1, true},        // one block of 2^31-1
		{[][]int{{0, math.MaxInt32/2 + 1}, {0, 0}}, 2, false}, // rows of 2 bytes past it
	} {
		if got := alltoallFitsCInts(c.splits, c.row); got != c.want {
			t.Errorf("splits %v of %d-byte rows: %v, want %v", c.splits, c.row, got, c.want)
		}
	}
}

// ReducescatterOptions.Output and AlltoallInto put the results in the caller's buffers, through
// the backend's own collectives and the fallbacks alike; a buffer of the wrong length is refused
// (a reducescatter's at once: its block is known; an alltoall's on that rank alone, once the
// splits are agreed, while the others get their results).
func TestReducescatterAndAlltoallIntoTheCallersBuffer(t *testing.T) {
	alias := func(v []int32) []byte { return mustTensor(t, nil, v).Data } // v's memory as bytes
	for _, native := range []bool{true, false} {
		hs, _, _, _ := exchangeJob(t, 2, native)
		onEveryRank(t, hs, func(h *Horovod) error {
			in := []int32{1, 2, 3, 4, 5, 6}
			x := mustTensor(t, []int{3, 2}, in)
			out := make([]int32, []int{4, 2}[h.Rank()])
			res, err := h.Reducescatter("rs", x, ReducescatterOptions{Op: Sum, Output: alias(out)})
			if err != nil {
				return err
			}
			want := [][]int32{{2, 4, 6, 8}, {10, 12}}[h.Rank()]
			if !slices.Equal(out, want) || &res.Data[0] != &alias(out)[0] {
				return fmt.Errorf("native=%v: reducescatter into the caller's buffer: %v (result in it: %v), want %v", native, out, &res.Data[0] == &alias(out)[0], want)
			}
			if _, err := h.Reducescatter("rs/short", x, ReducescatterOptions{Output: make([]byte, 4)}); err == nil || !strings.Contains(err.Error(), "Output holds 4 bytes for this rank's block of") {
				return fmt.Errorf("a short Output: %v", err)
			}
			if _, err := h.Reducescatter("rs/overlap", x, ReducescatterOptions{Output: x.Data[:len(alias(out))]}); err == nil || !strings.Contains(err.Error(), "overlaps") {
				return fmt.Errorf("an Output over the input: %v", err)
			}
			splits := [][]int{{1, 2}, {3, 0}}[h.Rank()]
			got := make([]int32, []int{8, 4}[h.Rank()])
			res, from, err := h.AlltoallInto("a2a", x, splits, alias(got))
			if err != nil {
				return err
			}
			wantA := [][]int32{{1, 2, 1, 2, 3, 4, 5, 6}, {3, 4, 5, 6}}[h.Rank()]
			if !slices.Equal(got, wantA) || !slices.Equal(from, [][]int{{1, 3}, {2, 0}}[h.Rank()]) || &res.Data[0] != &alias(got)[0] {
				return fmt.Errorf("native=%v: alltoall into the caller's buffer: %v from %v, want %v", native, got, from, wantA)
			}
			var wrong []byte
			if h.Rank() == 1 {
				wrong = make([]byte, 4) // rank 1 receives 4 int32, not 1
			} else {
				wrong = alias(make([]int32, 8))
			}
			_, _, err = h.AlltoallInto("a2a/wrong", x, splits, wrong)
			if h.Rank() == 1 && (err == nil || !strings.Contains(err.Error(), "the output buffer holds 4 bytes for a result of 16")) {
				return fmt.Errorf("a short buffer on rank 1: %v", err)
			}
			if h.Rank() == 0 && err != nil {
				return fmt.Errorf("rank 0 beside rank 1's short buffer: %v", err)
			}
			return nil
		})
	}
}
