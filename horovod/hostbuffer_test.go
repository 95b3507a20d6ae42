package horovod

import (
	"errors"
	"fmt"
	"strings"
	"testing"
	"unsafe"

	"github.com/gorovod/gorovod/horovod/backend"
)

// float32s views a HostBuffer's bytes as float32 values, as a training loop does.
func float32s(t *testing.T, b []byte) []float32 {
	t.Helper()
	if uintptr(unsafe.Pointer(unsafe.SliceData(b)))%4 != 0 || len(b)%4 != 0 {
		t.Fatalf("buffer of %d bytes at %p is not a float32 array", len(b), unsafe.SliceData(b))
	}
	return unsafe.Slice((*float32)(unsafe.Pointer(unsafe.SliceData(b))), len(b)/4)
}

// TestHostBufferInLentMemory reduces gradients in place in a HostBuffer over a data backend
// that lends host memory: the buffer must be the backend's memory, the fused allreduce must run
// on it in place (sending and receiving in lent memory), the results must be the averages over
// the ranks, and Free must give that very allocation back, once.
func TestHostBufferInLentMemory(t *testing.T) {
	const n = 1000
	hs, lenders := lendingJob(t, 2, true)
	onEveryRank(t, hs, func(h *Horovod) error {
		l := lenders[h.Rank()]
		b, err := h.AllocHost(2 * n * 4)
		if err != nil {
			return err
		}
		mem := b.Bytes()
		if !b.Lent() || len(mem) != 2*n*4 || !within(mem, l.live) {
			return fmt.Errorf("rank %d: %d bytes, lent %v, in the lender's memory %v", h.Rank(), len(mem), b.Lent(), within(mem, l.live))
		}
		flat := float32s(t, mem)
		var grads []NamedTensor
		for i, part := range [][]float32{flat[:n:n], flat[n:]} {
			g := exactGradient(t, fmt.Sprint("g", i), n, i, h.Rank())
			copy(part, mustValues[float32](g.Tensor))
			grads = append(grads, NamedTensor{Name: g.Name, Tensor: mustTensor(t, []int{n}, part)})
		}
		r, err := h.NewReducer(ReducerOptions{InPlace: true})
		if err != nil {
			return err
		}
		if _, _, err := r.Reduce(grads); err != nil {
			return err
		}
		for i := range 2 {
			a := mustValues[float32](exactGradient(t, "", n, i, 0).Tensor)
			c := mustValues[float32](exactGradient(t, "", n, i, 1).Tensor)
			for k := range n {
				if want := (a[k] + c[k]) / 2; flat[i*n+k] != want {
					return fmt.Errorf("rank %d: gradient %d element %d is %v, want %v", h.Rank(), i, k, flat[i*n+k], want)
				}
			}
		}
		l.mu.Lock()
		ar := l.allreduce
		l.mu.Unlock()
		if ar.calls != 1 || ar.sendLent != 1 || ar.recvLent != 1 {
			return fmt.Errorf("rank %d: %d data allreduces, %d sending and %d receiving in lent memory; want one, in place in the buffer", h.Rank(), ar.calls, ar.sendLent, ar.recvLent)
		}
		if err := b.Free(); err != nil {
			return err
		}
		l.mu.Lock()
		freed := len(l.freed) == 1 && unsafe.SliceData(l.freed[0]) == unsafe.SliceData(mem) && len(l.freed[0]) == len(mem)
		live := within(mem, l.live)
		l.mu.Unlock()
		if !freed || live {
			return fmt.Errorf("rank %d: after Free, the buffer given back: %v, still live: %v", h.Rank(), freed, live)
		}
		if b.Bytes() != nil {
			return fmt.Errorf("rank %d: Bytes after Free returned memory", h.Rank())
		}
		if err := b.Free(); err == nil || !strings.Contains(err.Error(), "freed twice") {
			return fmt.Errorf("rank %d: a second Free returned %v, want an error", h.Rank(), err)
		}
		return nil
	})
}

// refusing is a data backend that lends no memory: AllocHost fails, as cudaHostAlloc does out
// of pinned memory.
type refusing struct {
	backend.Backend
	frees int
}

func (r *refusing) AllocHost(n int) ([]byte, error) { return nil, errors.New("out of pinned memory") }
func (r *refusing) FreeHost(b []byte) error         { r.frees++; return nil }

// TestHostBufferGoMemory: over a backend that lends nothing, and over one that cannot lend, a
// HostBuffer is Go memory of the size asked for, which collectives take as well; the failure
// to lend is logged once with its reason, and Free gives nothing to the backend.
func TestHostBufferGoMemory(t *testing.T) {
	for _, lender := range []string{"none", "refusing"} {
		t.Run(lender, func(t *testing.T) {
			var log syncBuffer
			var r *refusing
			opts := []Option{WithLogOutput(&log)}
			if lender == "refusing" {
				opts = append(opts, WithDataBackend(func(control backend.Backend) (backend.Backend, error) {
					r = &refusing{Backend: control}
					return r, nil
				}))
			}
			hs, _ := job(t, 1, opts...)
			h := hs[0]
			for range 2 {
				b, err := h.AllocHost(12)
				if err != nil {
					t.Fatal(err)
				}
				if b.Lent() || len(b.Bytes()) != 12 {
					t.Fatalf("lent %v, %d bytes; want 12 bytes of Go memory", b.Lent(), len(b.Bytes()))
				}
				v := float32s(t, b.Bytes())
				copy(v, []float32{1, 2, 3})
				sum, err := h.Allreduce("x", mustTensor(t, nil, v), AllreduceOptions{Op: Sum})
				if err != nil {
					t.Fatal(err)
				}
				if got := mustValues[float32](sum); fmt.Sprint(got) != "[1 2 3]" {
					t.Fatalf("allreduce over the buffer: %v", got)
				}
				if err := b.Free(); err != nil {
					t.Fatal(err)
				}
			}
			logged := strings.Count(log.String(), "out of pinned memory; using Go memory instead")
			if lender == "refusing" && (logged != 1 || r.frees != 0) {
				t.Errorf("the failure to lend logged %d times (want once), %d FreeHost calls (want none); log:\n%s", logged, r.frees, log.String())
			}
			if lender == "none" && logged != 0 {
				t.Errorf("log: %s", log.String())
			}
		})
	}
}

// TestHostBufferAfterShutdown: once the job has shut down, a buffer the backend lent is freed
// memory: Bytes returns nil, Free does nothing (the backend is not asked to free it again) and
// returns nil, and a new AllocHost fails with ErrShutdown, lent memory or not.
func TestHostBufferAfterShutdown(t *testing.T) {
	for _, lend := range []bool{false, true} {
		t.Run(fmt.Sprint("lend=", lend), func(t *testing.T) {
			hs, lenders := lendingJob(t, 1, lend)
			h := hs[0]
			b, err := h.AllocHost(64)
			if err != nil {
				t.Fatal(err)
			}
			if b.Lent() != lend {
				t.Fatalf("lent %v, want %v", b.Lent(), lend)
			}
			if err := h.Shutdown(); err != nil {
				t.Fatal(err)
			}
			if b.Bytes() != nil {
				t.Error("Bytes after Shutdown returned memory")
			}
			if err := b.Free(); err != nil {
				t.Errorf("Free after Shutdown: %v", err)
			}
			if lend && len(lenders[0].freed) != 0 {
				t.Errorf("Free after Shutdown asked the closed backend to free %d allocations", len(lenders[0].freed))
			}
			if _, err := h.AllocHost(64); !errors.Is(err, ErrShutdown) {
				t.Errorf("AllocHost after Shutdown: %v, want ErrShutdown", err)
			}
			if _, err := h.AllocHost(0); err == nil {
				t.Error("AllocHost(0) succeeded")
			}
		})
	}
}
