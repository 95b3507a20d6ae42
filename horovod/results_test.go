package horovod

import (
	"fmt"
	"runtime"
	"slices"
	"strings"
	"testing"
	"time"
	"unsafe"
)

// Every length has a class whose buffers hold it with at most an eighth to spare (64 bytes up
// to 64), classes grow with the length, and a power of two is a class of its own size.
func TestResultClasses(t *testing.T) {
	prev := 0
	for n := 1; n < 1<<22; n += 1 + n/97 {
		k := classOf(n)
		c := classBytes(k)
		if c < n || (n > smallestResultClass && 8*c > 9*n) || (n <= smallestResultClass && c != smallestResultClass) {
			t.Fatalf("%d bytes: class %d of %d bytes", n, k, c)
		}
		if k < prev {
			t.Fatalf("%d bytes: class %d after class %d for a shorter length", n, k, prev)
		}
		prev = k
	}
	for e := 7; e < 40; e++ {
		if c := classBytes(classOf(1 << e)); c != 1<<e {
			t.Errorf("2^%d bytes: a class of %d", e, c)
		}
		if k := classOf(1<<e + 1); classBytes(k-1) != 1<<e {
			t.Errorf("2^%d+1 bytes: the class below holds %d", e, classBytes(k-1))
		}
	}
}

// A released result's memory is the next result of its size class, on every collective that
// returns a new tensor, and the recycled result holds this call's values, none of the last's.
func TestReleasedResultsAreRecycled(t *testing.T) {
	hs, _ := job(t, 2)
	onEveryRank(t, hs, func(h *Horovod) error {
		r := float32(h.Rank())
		input := func(n int, step float32) Tensor {
			v := make([]float32, n)
			for i := range v {
				v[i] = r + step + float32(i)
			}
			return mustTensor(t, nil, v)
		}
		ops := []struct {
			name string
			call func(x Tensor) (Tensor, error)
			want func(x Tensor, step float32) []float32
		}{
			{"allreduce", func(x Tensor) (Tensor, error) { return h.Allreduce("x", x, AllreduceOptions{Op: Sum}) },
				func(x Tensor, step float32) []float32 {
					w := slices.Clone(mustValues[float32](x))
					for i := range w {
						w[i] = 2*w[i] - 2*r + 1 // ranks 0 and 1
					}
					return w
				}},
			{"allgather", func(x Tensor) (Tensor, error) { return h.Allgather("x", x) },
				func(x Tensor, step float32) []float32 {
					n := x.NumElements()
					w := make([]float32, 2*n)
					for i := range n {
						w[i], w[n+i] = step+float32(i), 1+step+float32(i)
					}
					return w
				}},
			{"broadcast", func(x Tensor) (Tensor, error) { return h.Broadcast("x", x, 1) },
				func(x Tensor, step float32) []float32 {
					w := make([]float32, x.NumElements())
					for i := range w {
						w[i] = 1 + step + float32(i)
					}
					return w
				}},
		}
		for _, op := range ops {
			// 1000 and 990 float32s share the 4096-byte class; 1100 is the next one.
			first, err := op.call(input(1000, 0))
			if err != nil {
				return err
			}
			if err := h.Release(first); err != nil {
				return err
			}
			for step, n := range []int{1000, 990} {
				x := input(n, float32(10*(step+1)))
				got, err := op.call(x)
				if err != nil {
					return err
				}
				if unsafe.SliceData(got.Data) != unsafe.SliceData(first.Data) {
					return fmt.Errorf("%s of %d float32s after a Release: a new buffer, not the released one", op.name, n)
				}
				if v, want := mustValues[float32](got), op.want(x, float32(10*(step+1))); !slices.Equal(v, want) {
					return fmt.Errorf("%s of %d float32s into a recycled buffer: got %v..., want %v...", op.name, n, v[:3], want[:3])
				}
				if err := h.Release(got); err != nil {
					return err
				}
			}
			other, err := op.call(input(1100, 0))
			if err != nil {
				return err
			}
			if unsafe.SliceData(other.Data) == unsafe.SliceData(first.Data) {
				return fmt.Errorf("%s of 1100 float32s got a buffer of 4096 bytes", op.name)
			}
			if err := h.Release(other); err != nil {
				return err
			}
		}
		return nil
	})
}

// Release refuses what would corrupt a later result if recycled, and releases the rest.
func TestReleaseRefusesWhatIsNotAHeldResult(t *testing.T) {
	hs, _ := job(t, 1)
	h := hs[0]
	x := mustTensor(t, []int{4}, []float32{1, 2, 3, 4})
	res := func() Tensor {
		t.Helper()
		got, err := h.Allreduce("x", x, AllreduceOptions{Op: Sum})
		if err != nil {
			t.Fatal(err)
		}
		return got
	}
	a, b := res(), res()
	// Of a class of its own, so that no later result is handed its memory, which would make
	// it that result's (a stale tensor cannot be told from the memory's new holder).
	twice, err := h.Allreduce("y", mustTensor(t, []int{64}, make([]float32, 64)), AllreduceOptions{Op: Sum})
	if err != nil {
		t.Fatal(err)
	}
	if err := h.Release(twice); err != nil {
		t.Fatal(err)
	}
	part := res()
	inOutput, err := h.Allreduce("x", x, AllreduceOptions{Op: Sum, Output: make([]byte, 16)})
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		what string
		t    Tensor
	}{
		{"the caller's own tensor", x},
		{"a result into the caller's Output", inOutput},
		{"a result released already", twice},
		{"the tail of a result", Tensor{DType: Float32, Shape: []int{2}, Data: part.Data[8:]}},
		{"the head of a result", Tensor{DType: Float32, Shape: []int{2}, Data: part.Data[:8]}},
	} {
		err := h.Release(a, c.t, b)
		if err == nil || !strings.Contains(err.Error(), "tensor 1 of 3") {
			t.Errorf("Release of %s: err = %v", c.what, err)
		}
		if h.results.put(a.Data) || h.results.put(b.Data) {
			t.Fatalf("Release of %s beside two results: they were not released", c.what)
		}
		a, b = res(), res()
	}
	if err := h.Release(part, Tensor{DType: Float32, Shape: []int{0}, Data: []byte{}}); err != nil {
		t.Errorf("Release of a whole result and an empty one: %v", err)
	}
	h.Shutdown()
	if err := h.Release(a, b); err != nil {
		t.Errorf("Release after Shutdown: %v", err)
	}
}

// A result dropped without Release leaves the pool's record once collected, whether it comes
// back to the pool (a finalizer) or, above recycleDroppedMax, is freed (a cleanup): holding the
// record would grow without bound in a program that never releases.
func TestDroppedResultsAreForgotten(t *testing.T) {
	hs, _ := job(t, 1)
	h := hs[0]
	for _, c := range []struct{ floats, calls int }{{1024, 100}, {recycleDroppedMax/4 + 1, 3}} {
		x := mustTensor(t, []int{c.floats}, make([]float32, c.floats))
		for range c.calls {
			if _, err := h.Allreduce("x", x, AllreduceOptions{Op: Sum}); err != nil {
				t.Fatal(err)
			}
		}
		deadline := time.Now().Add(10 * time.Second)
		for h.results.outstanding() > 0 && time.Now().Before(deadline) {
			runtime.GC() // finalizers and cleanups run after the collection, on a goroutine of their own
			time.Sleep(10 * time.Millisecond)
		}
		if n := h.results.outstanding(); n > 0 {
			t.Errorf("%d of %d dropped results of %d bytes still recorded as held after collections", n, c.calls, 4*c.floats)
		}
	}
}

// A result dropped without Release comes back once a collection finds it unreachable: the next
// result of its class is the same memory (compared by address, which keeps nothing alive),
// holding the new call's values. A result of which the caller still holds a part is not
// recycled, and the part keeps its values through later calls.
func TestDroppedResultsAreRecycled(t *testing.T) {
	hs, _ := job(t, 1)
	h := hs[0]
	call := func(v float32) Tensor {
		t.Helper()
		got, err := h.Allreduce("x", mustTensor(t, []int{1 << 16}, slices.Repeat([]float32{v}, 1<<16)), AllreduceOptions{Op: Sum})
		if err != nil {
			t.Fatal(err)
		}
		return got
	}
	pooled := func() int {
		h.results.mu.Lock()
		defer h.results.mu.Unlock()
		n := 0
		for _, l := range h.results.free {
			n += len(l)
		}
		return n
	}
	collectUntilPooled := func() {
		deadline := time.Now().Add(10 * time.Second)
		for pooled() == 0 && time.Now().Before(deadline) {
			runtime.GC() // the finalizers run after the collection, on a goroutine of their own
			time.Sleep(10 * time.Millisecond)
		}
	}

	made := func() int {
		h.results.mu.Lock()
		defer h.results.mu.Unlock()
		return h.results.made
	}

	dropped := uintptr(unsafe.Pointer(&call(1).Data[0]))
	collectUntilPooled()
	before := made()
	again := call(2)
	// Both: the runtime may hand a freed buffer's address to a new allocation too.
	if got := uintptr(unsafe.Pointer(&again.Data[0])); got != dropped || made() != before {
		t.Fatalf("a dropped result's memory (%#x) was not the next result of its class (%#x, %d buffers made for it); %d buffers pooled", dropped, got, made()-before, pooled())
	}
	if v := mustValues[float32](again); v[0] != 2 || v[len(v)-1] != 2 {
		t.Fatalf("the recycled result holds %v...%v, want this call's 2", v[0], v[len(v)-1])
	}

	part := again.Data[100:200] // the caller keeps part of the result: none of it may be recycled
	again = Tensor{}
	want := slices.Clone(part)
	for range 5 {
		runtime.GC()
		time.Sleep(10 * time.Millisecond)
	}
	for v := float32(3); v < 6; v++ {
		if next := call(v); &next.Data[100] == &part[0] {
			t.Fatalf("call %v handed out memory the caller still holds part of", v)
		}
	}
	if !slices.Equal(part, want) {
		t.Fatal("the part of a result the caller kept changed under later calls")
	}
	runtime.KeepAlive(part)
}

// Released memory is not pinned: unused through two collections, it is dropped, and the pool
// stops watching for collections (which keeps it reachable).
func TestReleasedMemoryIsDroppedByCollections(t *testing.T) {
	hs, _ := job(t, 1)
	h := hs[0]
	got, err := h.Allreduce("x", mustTensor(t, []int{1024}, make([]float32, 1024)), AllreduceOptions{Op: Sum})
	if err != nil {
		t.Fatal(err)
	}
	if err := h.Release(got); err != nil {
		t.Fatal(err)
	}
	pooled := func() (n int, watching bool) {
		h.results.mu.Lock()
		defer h.results.mu.Unlock()
		for _, l := range h.results.free {
			n += len(l)
		}
		for _, l := range h.results.victim {
			n += len(l)
		}
		return n, h.results.watching
	}
	if n, watching := pooled(); n != 1 || !watching {
		t.Fatalf("after a Release: %d buffers pooled, watching %v; want 1, true", n, watching)
	}
	deadline := time.Now().Add(10 * time.Second)
	for n, watching := pooled(); (n > 0 || watching) && time.Now().Before(deadline); n, watching = pooled() {
		runtime.GC()
		time.Sleep(10 * time.Millisecond)
	}
	if n, watching := pooled(); n > 0 || watching {
		t.Errorf("after collections: %d buffers pooled, watching %v", n, watching)
	}
}

// A loop that releases its results allocates none after the first: the recycled buffer, not a
// new one, is what the collective writes (the pool's count of buffers it made proves the path is
// taken; the time it saves is make bench-peer's).
func TestReleasingLoopDoesNotAllocateResults(t *testing.T) {
	hs, _ := job(t, 2)
	const calls = 50
	onEveryRank(t, hs, func(h *Horovod) error {
		x := Tensor{DType: Float32, Shape: []int{1 << 18}, Data: make([]byte, 1<<20)}
		for range calls {
			got, err := h.Allreduce("x", x, AllreduceOptions{Op: Sum})
			if err != nil {
				return err
			}
			if err := h.Release(got); err != nil {
				return err
			}
		}
		h.results.mu.Lock()
		defer h.results.mu.Unlock()
		// 1, or one more where two collections fell between a Release and the next call.
		if h.results.made > 2 {
			return fmt.Errorf("%d calls of a 1 MiB allreduce, each result released: %d buffers made, want 1", calls, h.results.made)
		}
		return nil
	})
}
