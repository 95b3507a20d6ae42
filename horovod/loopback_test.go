package horovod

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"runtime"
	"slices"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/gorovod/gorovod/horovod/backend"
	"github.com/gorovod/gorovod/horovod/bf16"
	"github.com/gorovod/gorovod/horovod/fp16"
)

// loopback is an in-process backend: n ranks are n Horovod instances in one test process, and
// every collective is a rendezvous of their goroutines. It lets the controller's logic (negotiation,
// errors, fusion, join, stalls, timeline) be tested without MPI; the MPI conformance suite checks the
// same behaviour across processes.
type loopback struct {
	mu      sync.Mutex
	cond    *sync.Cond
	size    int
	slots   [][]byte
	result  [][]byte // the last completed round's contributions
	arrived int
	gen     int
	calls   map[string]*atomic.Int64 // "allreduce" etc.: collectives issued by rank 0
	aborted chan int

	failAllreduce atomic.Bool // the next data allreduce fails on every rank
	cannotSplit   atomic.Bool // Split refuses on every rank, as a backend opened without process sets

	record   atomic.Bool
	gathered atomic.Int64 // negotiation message bytes rank 0 sent while record is set

	// stopped, when set, holds the negotiation rounds of one rank until it is closed, as if
	// that rank's process had been stopped (SIGSTOP) between rounds.
	stopped atomic.Pointer[stoppedRank]

	// splits are the loopbacks of the process sets split off, by the order of the Split calls
	// (every rank makes them in the same order); splitCalls counts each rank's calls so far.
	splits     map[int]*loopback
	splitCalls []int
}

type stoppedRank struct {
	rank int
	cont chan struct{}
}

func (g *loopback) recordGathers(on bool) { g.record.Store(on) }

type loopRank struct {
	g    *loopback
	rank int
}

func newLoopback(size int) *loopback {
	g := &loopback{size: size, slots: make([][]byte, size), calls: map[string]*atomic.Int64{}, aborted: make(chan int, size),
		splits: map[int]*loopback{}, splitCalls: make([]int, size)}
	for _, k := range []string{"allreduce", "broadcast", "allgatherv", "barrier", "split"} {
		g.calls[k] = &atomic.Int64{}
	}
	g.cond = sync.NewCond(&g.mu)
	return g
}

// gather is the one primitive: every rank contributes a copy of send and gets everyone's.
func (l loopRank) gather(kind string, send []byte) [][]byte {
	g := l.g
	if l.rank == 0 {
		g.calls[kind].Add(1)
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	gen := g.gen
	g.slots[l.rank] = bytes.Clone(send)
	g.arrived++
	if g.arrived == g.size {
		// A snapshot: a fast rank may deposit its next contribution before the others wake.
		g.result = slices.Clone(g.slots)
		g.arrived = 0
		g.gen++
		g.cond.Broadcast()
	} else {
		for g.gen == gen {
			g.cond.Wait()
		}
	}
	return g.result
}

func (l loopRank) Name() string { return "loopback" }
func (l loopRank) Topology() backend.Topology {
	return backend.Topology{Rank: l.rank, Size: l.g.size, LocalRank: l.rank, LocalSize: l.g.size, CrossSize: 1}
}

func (l loopRank) Allreduce(send, recv []byte, dt backend.DType, op backend.ReduceOp) error {
	if l.g.failAllreduce.Load() {
		return errors.New("link down")
	}
	all := l.gather("allreduce", send)
	acc := make([]float64, len(send)/dt.Size())
	for r, b := range all {
		for i := range acc {
			if v := element(b, dt, i); r == 0 {
				acc[i] = v
			} else {
				acc[i] = combine(op, acc[i], v)
			}
		}
	}
	for i, v := range acc {
		setElement(recv, dt, i, v)
	}
	return nil
}

// combine is op's reduction of acc, what the ranks before contributed, with v.
func combine(op backend.ReduceOp, acc, v float64) float64 {
	switch op {
	case backend.Sum:
		return acc + v
	case backend.Min:
		return math.Min(acc, v)
	case backend.Max:
		return math.Max(acc, v)
	case backend.Product:
		return acc * v
	}
	panic(fmt.Sprintf("loopback: reduce op %v", op))
}

func element(b []byte, dt backend.DType, i int) float64 {
	switch dt {
	case Float32:
		return float64(view[float32](b)[i])
	case Float64:
		return view[float64](b)[i]
	case Float16:
		return fp16.ToFloat64(view[uint16](b)[i])
	case BFloat16:
		return bf16.ToFloat64(view[uint16](b)[i])
	case Int32:
		return float64(view[int32](b)[i])
	case Int64:
		return float64(view[int64](b)[i])
	case Int8:
		return float64(view[int8](b)[i])
	}
	return float64(b[i])
}

func setElement(b []byte, dt backend.DType, i int, v float64) {
	switch dt {
	case Float32:
		view[float32](b)[i] = float32(v)
	case Float64:
		view[float64](b)[i] = v
	case Float16:
		view[uint16](b)[i] = fp16.FromFloat64(v)
	case BFloat16:
		view[uint16](b)[i] = bf16.FromFloat64(v)
	case Int32:
		view[int32](b)[i] = int32(v)
	case Int64:
		view[int64](b)[i] = int64(v)
	case Int8:
		view[int8](b)[i] = int8(v)
	default:
		b[i] = uint8(v)
	}
}

// Broadcast only reads the root's buf, as the backend contract says.
func (l loopRank) Broadcast(buf []byte, root int) error {
	from := l.gather("broadcast", buf)[root]
	if l.rank != root {
		copy(buf, from)
	}
	return nil
}

func (l loopRank) Allgatherv(send, recv []byte, counts []int) error {
	if l.rank == 0 && l.g.record.Load() && len(send) == slotSize {
		// A negotiation round: count the encoded message, whose length leads the slot.
		l.g.gathered.Add(int64(binary.LittleEndian.Uint32(send)))
	}
	if s := l.g.stopped.Load(); s != nil && s.rank == l.rank {
		<-s.cont
	}
	recv = recv[:0]
	for _, b := range l.gather("allgatherv", send) {
		recv = append(recv, b...)
	}
	return nil
}

func (l loopRank) Barrier() error { l.gather("barrier", nil); return nil }

// Abort records the abort and ends the calling goroutine (an abort never returns).
func (l loopRank) Abort(code int) {
	l.g.aborted <- l.rank
	runtime.Goexit()
}

func (l loopRank) Close() error { return nil }

// Split is a rendezvous of every rank, as MPI_Comm_split is a collective of the whole
// communicator; each member then gets its rank in a loopback of the set's own.
func (l loopRank) Split(ranks []int) (backend.Backend, error) {
	if l.g.cannotSplit.Load() {
		return nil, fmt.Errorf("loopback: %w", backend.ErrCannotSplit)
	}
	l.gather("split", nil)
	g := l.g
	g.mu.Lock()
	defer g.mu.Unlock()
	call := g.splitCalls[l.rank]
	g.splitCalls[l.rank]++
	set := g.splits[call]
	if set == nil {
		set = newLoopback(len(ranks))
		g.splits[call] = set
	}
	if i := slices.Index(ranks, l.rank); i >= 0 {
		return loopRank{set, i}, nil
	}
	return nil, nil
}

// job starts size ranks over one loopback and shuts them down when the test ends.
func job(t *testing.T, size int, opts ...Option) ([]*Horovod, *loopback) {
	t.Helper()
	g := newLoopback(size)
	hs, errs := initRanks(g, func(int) []Option { return opts })
	if err := errors.Join(errs...); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		for _, h := range hs {
			h.Shutdown()
		}
	})
	return hs, g
}

// initRanks calls Init for every rank of g at once, as the processes of a job do: Init agrees
// with the other ranks, so it returns on none until it has run on all. Each rank's options are
// its loopback backend, a discarded log, then opts(rank).
func initRanks(g *loopback, opts func(rank int) []Option) ([]*Horovod, []error) {
	hs := make([]*Horovod, g.size)
	errs := make([]error, g.size)
	var wg sync.WaitGroup
	for r := range g.size {
		wg.Go(func() {
			hs[r], errs[r] = Init(append([]Option{WithBackend(loopRank{g, r}), WithLogOutput(&bytes.Buffer{})}, opts(r)...)...)
		})
	}
	wg.Wait()
	return hs, errs
}

// onEveryRank runs f concurrently for every rank and fails the test with every rank's error.
func onEveryRank(t *testing.T, hs []*Horovod, f func(h *Horovod) error) {
	t.Helper()
	errs := make([]error, len(hs))
	var wg sync.WaitGroup
	for r, h := range hs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs[r] = f(h)
		}()
	}
	wg.Wait()
	for r, err := range errs {
		if err != nil {
			t.Errorf("rank %d: %v", r, err)
		}
	}
}

func mustTensor[T Element](t testing.TB, shape []int, v []T) Tensor {
	t.Helper()
	x, err := NewTensor(shape, v)
	if err != nil {
		t.Fatal(err)
	}
	return x
}

func mustValues[T Element](t Tensor) []T {
	v, err := Values[T](t)
	if err != nil {
		panic(err)
	}
	return v
}
