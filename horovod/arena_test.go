package horovod

import (
	"bytes"
	"errors"
	"fmt"
	"math/rand/v2"
	"sync"
	"testing"
	"unsafe"

	"github.com/gorovod/gorovod/horovod/backend"
	"github.com/gorovod/gorovod/horovod/internal/parallel"
)

// lending is a data backend that lends host memory (backend.HostAllocator) over another
// backend's collectives, as the NCCL backend lends pinned memory. It keeps account: which
// allocations are live, how the data allreduces' buffers lay in them; it poisons memory it
// frees, so that a use after free changes results.
type lending struct {
	backend.Backend
	mu        sync.Mutex
	live      map[*byte][]byte
	freed     [][]byte
	allocs    int
	allreduce struct{ calls, sendLent, recvLent, overlapping int }
	closed    bool
}

func (l *lending) AllocHost(n int) ([]byte, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.closed {
		return nil, errors.New("closed")
	}
	b := make([]byte, n)
	l.live[&b[0]] = b
	l.allocs++
	return b, nil
}

func (l *lending) FreeHost(b []byte) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.closed {
		return nil
	}
	if l.live[&b[0]] == nil {
		return errors.New("not an allocation of this backend")
	}
	delete(l.live, &b[0])
	for i := range b {
		b[i] = 0xFF // NaN in every float type
	}
	l.freed = append(l.freed, b)
	return nil
}

// within reports whether p lies inside one of the allocations.
func within(p []byte, allocs map[*byte][]byte) bool {
	for _, a := range allocs {
		lo, hi := uintptr(unsafe.Pointer(&a[0])), uintptr(unsafe.Pointer(&a[0]))+uintptr(len(a))
		if len(p) > 0 && uintptr(unsafe.Pointer(&p[0])) >= lo && uintptr(unsafe.Pointer(&p[0]))+uintptr(len(p)) <= hi {
			return true
		}
	}
	return false
}

func (l *lending) Allreduce(send, recv []byte, dt backend.DType, op backend.ReduceOp) error {
	l.mu.Lock()
	l.allreduce.calls++
	if within(send, l.live) {
		l.allreduce.sendLent++
	}
	if within(recv, l.live) {
		l.allreduce.recvLent++
	}
	if parallel.Overlap(send, recv) && !parallel.Same(send, recv) { // backend.Backend forbids it
		l.allreduce.overlapping++
	}
	l.mu.Unlock()
	return l.Backend.Allreduce(send, recv, dt, op)
}

func (l *lending) Close() error {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.closed, l.live = true, nil
	return nil
}

// TestReducerArenasInLentMemory runs the same Reducer steps in a two-rank job whose data backend
// lends host memory and in one whose backend does not: the results must be the same bytes (the
// same arithmetic on the same values, element by element, only in other memory); with
// the lender, the results and the float16 wire copies must lie in its memory and the fused
// allreduces run in place there, as must a grouped allreduce of tensors apart (in the fusion
// buffer); memory the arenas outgrow must be given back only after
// the step that reads it (the previous step's results handed back to Reduce, with more
// gradients than before) and all of it at Close.
func TestReducerArenasInLentMemory(t *testing.T) {
	steps := []ReducerOptions{
		{},
		{Compression: FP16Compression},
		{Compression: FP16Compression, GradientPredivideFactor: 2},
	}
	run := func(lend bool) ([][]byte, []*lending) {
		hs, lenders := lendingJob(t, 2, lend)
		results := make([][]byte, 2)
		onEveryRank(t, hs, func(h *Horovod) error {
			r := rand.New(rand.NewPCG(21, uint64(h.Rank())))
			// The int32 gradient first: the float32 ones lie back to back in the result arena.
			grads := []NamedTensor{{Name: "i", Tensor: Tensor{DType: Int32, Shape: []int{5}, Data: randomBuffer(Int32, 5, r)}}}
			for i, n := range []int{1000, 7, 3001} {
				grads = append(grads, NamedTensor{Name: fmt.Sprint("g", i), Tensor: Tensor{DType: Float32, Shape: []int{n}, Data: randomBuffer(Float32, n, r)}})
			}
			var out []byte
			for _, o := range steps {
				red, err := h.NewReducer(o)
				if err != nil {
					return err
				}
				first, _, err := red.Reduce(grads)
				if err != nil {
					return err
				}
				for _, g := range first {
					out = append(out, g.Data...)
				}
				// The results back in, with one more gradient: both arenas grow.
				more := append(first, NamedTensor{Name: "extra", Tensor: Tensor{DType: Float32, Shape: []int{4096}, Data: randomBuffer(Float32, 4096, r)}})
				second, _, err := red.Reduce(more)
				if err != nil {
					return fmt.Errorf("%+v, second step: %w", o, err)
				}
				for _, g := range second {
					out = append(out, g.Data...)
				}
				if l := lenders[h.Rank()]; l != nil {
					l.mu.Lock()
					live := len(l.live)
					for _, g := range second {
						if g.DType == Float32 && !within(g.Data, l.live) {
							live = -1
						}
					}
					l.mu.Unlock()
					if want := map[bool]int{false: 1, true: 2}[o.Compression == FP16Compression]; live != want {
						return fmt.Errorf("%+v: after growing, %d live allocations holding the results (-1: a result outside them), want %d", o, live, want)
					}
				}
				if err := red.Close(); err != nil {
					return err
				}
			}
			// Tensors apart in Go memory fuse in the fusion buffer, which is lent memory too.
			grouped, err := h.GroupedAllreduce(grads[1:], AllreduceOptions{})
			if err != nil {
				return err
			}
			for _, g := range grouped {
				out = append(out, g.Data...)
			}
			results[h.Rank()] = out
			return nil
		})
		return results, lenders
	}
	want, _ := run(false)
	got, lenders := run(true)
	for rank := range want {
		if len(want[rank]) == 0 || !bytes.Equal(got[rank], want[rank]) {
			t.Errorf("rank %d: the results in lent memory differ from those in Go memory", rank)
		}
		l := lenders[rank]
		// Per Reducer: the result arena, plus the wire arena with fp16; each allocated twice and
		// given back. Then the fusion buffer, the backend's until Shutdown.
		if l.allocs != 2*(1+2+2)+1 || len(l.freed) != 10 {
			t.Errorf("rank %d: %d allocations, %d freed; want 11 and 10", rank, l.allocs, len(l.freed))
		}
		// Every step's float32 gradients fuse into one allreduce in place in an arena; the int32
		// one (its own dtype) writes into the result arena and reads the caller's memory in the
		// first step of the two Reducers without a prescale (with one, it is scaled in the result
		// arena first), the previous results (lent memory) in the second. The grouped allreduce
		// runs in place in the fusion buffer.
		if a := l.allreduce; a.calls != 2*2*len(steps)+1 || a.recvLent != a.calls || a.sendLent != a.calls-2 {
			t.Errorf("rank %d: %d data allreduces, %d sending and %d receiving in lent memory", rank, a.calls, a.sendLent, a.recvLent)
		}
	}
}

// TestArenasOutgrownInAFailedStepAreKept: a step that fails (here the ranks disagree on a
// gradient's shape, which fails the step on every rank and leaves the job running) may leave the
// backend working on the memory its arenas outgrew, so that memory is given back only after the
// next step that succeeds, not after the failed one.
func TestArenasOutgrownInAFailedStepAreKept(t *testing.T) {
	hs, lenders := lendingJob(t, 2, true)
	onEveryRank(t, hs, func(h *Horovod) error {
		r, err := h.NewReducer(ReducerOptions{})
		if err != nil {
			return err
		}
		defer r.Close()
		l := lenders[h.Rank()]
		freed := func() int {
			l.mu.Lock()
			defer l.mu.Unlock()
			return len(l.freed)
		}
		if _, _, err := r.Reduce([]NamedTensor{exactGradient(t, "a", 10, 1, h.Rank())}); err != nil {
			return err
		}
		// 1000 values on rank 0, 1001 on rank 1: the arena grows on both, and the step fails.
		if _, _, err := r.Reduce([]NamedTensor{exactGradient(t, "a", 1000+h.Rank(), 2, h.Rank())}); err == nil {
			return errors.New("a step with shapes differing between ranks succeeded")
		}
		if n := freed(); n != 0 {
			return fmt.Errorf("%d allocations given back after a failed step", n)
		}
		if _, _, err := r.Reduce([]NamedTensor{exactGradient(t, "a", 2000, 3, h.Rank())}); err != nil {
			return err
		}
		if n := freed(); n != 2 {
			return fmt.Errorf("%d allocations given back after the next successful step, want the 2 outgrown", n)
		}
		return nil
	})
}
