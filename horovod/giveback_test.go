package horovod

import (
	"bytes"
	"fmt"
	"slices"
	"sync"
	"testing"

	"github.com/gorovod/gorovod/horovod/backend"
)

// exactGradient is a float32 gradient of n values k/1024 (|k| < 512) that differ by name, seed
// and rank: their averages over two ranks, and the averages of those, are exact in float32 and
// in float16, so a Reducer step whose inputs are the previous step's results returns them
// unchanged, compressed or not.
func exactGradient(t *testing.T, name string, n, seed, rank int) NamedTensor {
	v := make([]float32, n)
	for i := range v {
		v[i] = float32((i*7+seed*131+rank*17)%1000-500) / 1024
	}
	return NamedTensor{Name: name, Tensor: mustTensor(t, []int{n}, v)}
}

// lendingJob is a job of size ranks whose data backends lend host memory (lending) when lend is
// set; it returns the lenders by rank.
func lendingJob(t *testing.T, size int, lend bool) ([]*Horovod, []*lending) {
	lenders := make([]*lending, size)
	var opts []Option
	if lend {
		var mu sync.Mutex
		opts = append(opts, WithDataBackend(func(control backend.Backend) (backend.Backend, error) {
			l := &lending{Backend: control, live: map[*byte][]byte{}}
			mu.Lock()
			lenders[control.Topology().Rank] = l
			mu.Unlock()
			return l, nil
		}))
	}
	hs, _ := job(t, size, opts...)
	return hs, lenders
}

// TestReducerResultsHandedBackInAnotherArrangement gives a step's results back to Reduce, as
// its documentation allows, in another arrangement than they were returned in: after another
// gradient that takes their place in the result arena ("behind another"), and after a tensor of
// another dtype whose own allreduce writes over them and shifts them ("shifted": result and
// input partly overlapping). The step must return them unchanged (their average over ranks is
// themselves), over a backend that lends host memory and over one that does not, uncompressed
// and with fp16 compression; the backend must never be handed a send and a receive buffer that
// partly overlap (backend.Backend forbids it).
func TestReducerResultsHandedBackInAnotherArrangement(t *testing.T) {
	for _, lend := range []bool{false, true} {
		for _, o := range []ReducerOptions{{}, {Compression: FP16Compression}} {
			t.Run(fmt.Sprintf("lend=%v/compression=%v", lend, o.Compression), func(t *testing.T) {
				hs, lenders := lendingJob(t, 2, lend)
				onEveryRank(t, hs, func(h *Horovod) error {
					r, err := h.NewReducer(o)
					if err != nil {
						return err
					}
					defer r.Close()
					g := func(name string, n, seed int) NamedTensor { return exactGradient(t, name, n, seed, h.Rank()) }
					w := NamedTensor{Name: "w", Tensor: mustTensor(t, []int{300}, make([]int32, 300))}
					for _, c := range []struct {
						name                string
						first, second, then []NamedTensor
					}{
						{"behind another", []NamedTensor{g("x", 16, 1), g("a", 16, 2), g("b", 16, 3)}, []NamedTensor{g("a", 16, 4), g("b", 16, 5)}, []NamedTensor{g("x", 16, 6)}},
						{"shifted", []NamedTensor{g("a", 1000, 1), g("b", 1000, 2), w}, []NamedTensor{g("z", 100, 3), g("a", 1000, 4), g("b", 1000, 5)}, []NamedTensor{w}},
					} {
						if _, _, err := r.Reduce(c.first); err != nil {
							return err
						}
						res, _, err := r.Reduce(c.second)
						if err != nil {
							return err
						}
						given := res[len(res)-2:]
						want := [][]byte{bytes.Clone(given[0].Data), bytes.Clone(given[1].Data)}
						res, _, err = r.Reduce(append(c.then, given...))
						if err != nil {
							return err
						}
						for i, got := range res[len(res)-2:] {
							if !bytes.Equal(got.Data, want[i]) {
								return fmt.Errorf("%s: result %q of a step given the previous results differs from them", c.name, got.Name)
							}
						}
					}
					return nil
				})
				for rank, l := range lenders {
					if l != nil && l.allreduce.overlapping != 0 {
						t.Errorf("rank %d: %d backend allreduces with send and recv partly overlapping", rank, l.allreduce.overlapping)
					}
				}
			})
		}
	}
}

// TestFusedAllreduceOutputsOverlappingInputs drives the controller directly with what a Reducer
// could hand it (outputs it chose itself, given with the request) laid out to overlap the
// inputs: a batch whose outputs are its inputs shifted, one whose outputs swap the inputs'
// places, and single tensors partly overlapping their output, with and without a prescale. The
// averages must be those of the inputs as they were, and the backend must never see partly
// overlapping send and receive buffers.
func TestFusedAllreduceOutputsOverlappingInputs(t *testing.T) {
	const n = 64 // float32 values per tensor
	type layout struct {
		name     string
		inputs   []int // offsets of the tensors' inputs in one buffer, in values
		outputs  []int // and of their outputs
		prescale float64
	}
	layouts := []layout{
		{"batch shifted", []int{10, 10 + n}, []int{20, 20 + n}, 1},
		{"batch swapped", []int{0, n}, []int{n, 0}, 1},
		{"batch behind another, prescaled", []int{0, n}, []int{n, 2 * n}, 0.5},
		{"single shifted", []int{0}, []int{5}, 1},
		{"single shifted, prescaled", []int{5}, []int{0}, 0.5},
	}
	for _, lend := range []bool{false, true} {
		t.Run(fmt.Sprintf("lend=%v", lend), func(t *testing.T) {
			hs, lenders := lendingJob(t, 2, lend)
			onEveryRank(t, hs, func(h *Horovod) error {
				for li, l := range layouts {
					mem := make([]float32, 4*n)
					wants := make([][]float32, len(l.inputs))
					reqs := make([]*request, len(l.inputs))
					for i, at := range l.inputs {
						in := mem[at : at+n]
						wants[i] = make([]float32, n)
						for k := range in {
							mine := float32((k*3+i*5+h.Rank()*11)%200-100) / 64
							other := float32((k*3+i*5+(1-h.Rank())*11)%200-100) / 64
							in[k] = mine
							wants[i][k] = (mine*float32(l.prescale) + other*float32(l.prescale)) / 2
						}
					}
					for i, at := range l.inputs {
						in := mustTensor(t, []int{n}, mem[at:at+n])
						req, err := h.allreduceRequest(fmt.Sprintf("layout%d/%d", li, i), 0, in, AllreduceOptions{Prescale: l.prescale})
						if err != nil {
							return err
						}
						req.output = mustTensor(t, []int{n}, mem[l.outputs[i]:l.outputs[i]+n]).Data
						reqs[i] = req
					}
					if err := h.ctl.submit(reqs...); err != nil {
						return err
					}
					results, err := waitAll(reqs)
					if err != nil {
						return err
					}
					for i, res := range results {
						if got := view[float32](res.Data); !slices.Equal(got, wants[i]) {
							return fmt.Errorf("%s: tensor %d: %v, want %v", l.name, i, got[:4], wants[i][:4])
						}
					}
				}
				return nil
			})
			for rank, l := range lenders {
				if l != nil && l.allreduce.overlapping != 0 {
					t.Errorf("rank %d: %d backend allreduces with send and recv partly overlapping", rank, l.allreduce.overlapping)
				}
			}
		})
	}
}
