package horovod

import (
	"fmt"
	"slices"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/gorovod/gorovod/horovod/backend"
)

// dataGathers is a data backend that counts its allgathers: the control backend's negotiation
// rounds, which are allgathers too, go elsewhere.
type dataGathers struct {
	backend.Backend
	calls *atomic.Int64
}

func (d dataGathers) Allgatherv(send, recv []byte, counts []int) error {
	d.calls.Add(1)
	return d.Backend.Allgatherv(send, recv, counts)
}

// Allgathers submitted together run as one backend allgather within the fusion threshold, each
// result holding every rank's rows of its own tensor in rank order, whatever the dtypes and first
// dimensions (rank r gathers r+i rows of tensor i, so some ranks send none of some tensors).
func TestAllgathersFuse(t *testing.T) {
	dtypes := []DType{Float32, Int64, Uint8, Float64}
	rowsOf := func(rank, i int) int { return (rank + i) % 3 }
	value := func(rank, i, row, col int) float64 { return float64(rank*100 + i*10 + row*3 + col) }
	for _, c := range []struct {
		threshold int
		calls     int64
	}{{DefaultFusionThreshold, 1}, {0, 4}} {
		const size = 3
		calls := make([]*atomic.Int64, size)
		for r := range calls {
			calls[r] = &atomic.Int64{}
		}
		g := newLoopback(size)
		hs, errs := initRanks(g, func(rank int) []Option {
			return []Option{WithFusionThreshold(c.threshold), WithDataBackend(func(control backend.Backend) (backend.Backend, error) {
				return dataGathers{control, calls[rank]}, nil
			})}
		})
		for _, err := range errs {
			if err != nil {
				t.Fatal(err)
			}
		}
		t.Cleanup(func() {
			for _, h := range hs {
				h.Shutdown()
			}
		})
		onEveryRank(t, hs, func(h *Horovod) error {
			reqs := make([]*request, len(dtypes))
			for i, dt := range dtypes {
				n := rowsOf(h.Rank(), i)
				x := Tensor{DType: dt, Shape: []int{n, 2}, Data: make([]byte, n*2*dt.Size())}
				for row := range n {
					for col := range 2 {
						setElement(x.Data, dt, row*2+col, value(h.Rank(), i, row, col))
					}
				}
				reqs[i] = &request{spec: spec{name: fmt.Sprintf("g%d", i), kind: kindAllgather, dtype: dt, shape: x.Shape}, input: x.Data}
			}
			// Submitted at once, as a Reducer's tensors are: one negotiation round sees them all.
			if err := h.ctl.submit(reqs...); err != nil {
				return err
			}
			for i, req := range reqs {
				<-req.done
				if req.err != nil {
					return req.err
				}
				var want []float64
				for rank := range size {
					for row := range rowsOf(rank, i) {
						want = append(want, value(rank, i, row, 0), value(rank, i, row, 1))
					}
				}
				got := make([]float64, len(want))
				for j := range got {
					got[j] = element(req.result.Data, dtypes[i], j)
				}
				if !slices.Equal(got, want) || !slices.Equal(req.result.Shape, []int{len(want) / 2, 2}) {
					return fmt.Errorf("g%d: %v %v, want %v", i, req.result.Shape, got, want)
				}
			}
			return nil
		})
		for r, n := range calls {
			if n.Load() != c.calls {
				t.Errorf("threshold %d: rank %d made %d backend allgathers for 4 tensors, want %d", c.threshold, r, n.Load(), c.calls)
			}
		}
	}
}

// AllgatherInto gathers into the caller's buffer, alone or fused with other allgathers; a buffer
// of the wrong length fails on its rank only, and the other ranks get their results.
func TestAllgatherIntoTheCallersBuffer(t *testing.T) {
	hs, _ := job(t, 3)
	onEveryRank(t, hs, func(h *Horovod) error {
		// Rank r sends r+1 rows of 2: 6 rows in all.
		rows := h.Rank() + 1
		vals := make([]float32, rows*2)
		for i := range vals {
			vals[i] = float32(h.Rank()*10 + i)
		}
		x := mustTensor(t, []int{rows, 2}, vals)
		want := []float32{0, 1, 10, 11, 12, 13, 20, 21, 22, 23, 24, 25}
		out := make([]byte, 4*len(want))
		for call := range 3 {
			got, err := h.AllgatherInto("g", x, out)
			if err != nil {
				return err
			}
			if &got.Data[0] != &out[0] || !slices.Equal(got.Shape, []int{6, 2}) || !slices.Equal(mustValues[float32](got), want) {
				return fmt.Errorf("call %d: got %v %v (into the buffer: %v), want %v", call, got.Shape, mustValues[float32](got), &got.Data[0] == &out[0], want)
			}
		}
		// Beside a plain Allgather submitted just before (fused where the two meet in one round).
		hd, err := h.AllgatherAsync("other", x)
		if err != nil {
			return err
		}
		clear(out)
		got, err := h.AllgatherInto("g", x, out)
		if err != nil {
			return err
		}
		if _, err := hd.Wait(); err != nil {
			return err
		}
		if &got.Data[0] != &out[0] || !slices.Equal(mustValues[float32](got), want) {
			return fmt.Errorf("fused: got %v, want %v in the buffer", mustValues[float32](got), want)
		}
		// Rank 1's buffer is one row short: its call fails, the others' succeed.
		short := out
		if h.Rank() == 1 {
			short = out[:len(out)-8]
		}
		got, err = h.AllgatherInto("g", x, short)
		if h.Rank() == 1 {
			if err == nil || !strings.Contains(err.Error(), "holds 40 bytes for a result of 48") {
				return fmt.Errorf("a short buffer on rank 1: %v", err)
			}
			return nil
		}
		if err != nil || !slices.Equal(mustValues[float32](got), want) {
			return fmt.Errorf("rank %d beside rank 1's short buffer: %v %v", h.Rank(), mustValues[float32](got), err)
		}
		if _, err := h.AllgatherInto("g", x, x.Data); err == nil || !strings.Contains(err.Error(), "overlaps") {
			return fmt.Errorf("the input as output: %v", err)
		}
		return nil
	})
}
