package horovod

import (
	"fmt"
	mathbits "math/bits"
	"runtime"
	"sync"
	"unsafe"
	"weak"
)

// resultPool is the memory of the results horovod allocates (Allreduce without Output,
// Allgather, Broadcast), recycled as TensorFlow's allocator recycles the output tensors of
// Horovod's ops once they are dropped. A result comes back to the pool in one of two ways: at
// once, when its caller gives it back with Release, or once the garbage collector finds it
// dropped (a finalizer on its buffer, which then lives on as pooled memory instead of being
// freed). A pooled buffer goes to the free list of its size class and is handed out again,
// unzeroed, as a later result of that class: the collective overwrites every byte of it. So a
// program that drops its results allocates only until the collections catch up, instead of
// allocating (and the runtime zeroing) every result.
//
// Pooled memory is not pinned for long: as in a sync.Pool, what lies unused through a garbage
// collection becomes the victim list, which the next collection drops. (A sync.Pool itself hands
// a buffer put on one processor to a Get on another only by chance, and the caller releases on
// its goroutine while results are made on the background loop's.)
//
// out is what keeps Release from recycling memory that is not a result or is still in use
// elsewhere (a caller's own slice, a result released twice, a slice of one): the results handed
// out and not back, by weak pointer to their first byte, which does not keep them alive and,
// unlike an address, never matches a later object at the same address (nor the same buffer
// handed out again after a finalizer brought it back: the weak package's rule for resurrected
// objects, which is why the finalizer carries the key it was handed out under).
type resultPool struct {
	mu           sync.Mutex
	out          map[weak.Pointer[byte]]int // handed out, not back: the result's length
	free, victim map[int][]*byte            // back, by size class (see classOf): first bytes
	watching     bool                       // a collection will call collected
	made         int                        // buffers allocated rather than recycled
}

// smallestResultClass is the least capacity of a pooled buffer: results this short share their
// class, and it keeps them out of the runtime's tiny allocator, whose blocks hold several
// objects (a weak pointer or cleanup would then follow the block, not the result).
const smallestResultClass = 64

// classOf is the size class of an n-byte result: 64 bytes up to 64, above that n rounded up to
// one of 8 steps per power of two, so a pooled buffer wastes at most an eighth of itself.
func classOf(n int) int {
	if n <= smallestResultClass {
		return 0
	}
	e := mathbits.Len(uint(n - 1)) // 2^(e-1) < n <= 2^e
	unit := 1 << (e - 4)
	k := (n + unit - 1) / unit // 9..16
	return e*8 + k - 9
}

// classBytes is the capacity of the buffers of class k.
func classBytes(k int) int {
	if k == 0 {
		return smallestResultClass
	}
	e, step := k/8, k%8
	return (step + 9) << (e - 4)
}

// recycleDroppedMax is the largest class whose dropped results come back to the pool. A
// resurrected buffer stays live through collections that would have freed it, and the runtime
// paces collections by the live heap: results of hundreds of MiB then keep it growing, each new
// one fresh memory from the kernel, faulted in page by page, which costs more than the
// allocation it saves (make bench-peer, 2-rank 256 MiB averages: 0.14-0.48 s a call against
// 0.05-0.07 s without).
const recycleDroppedMax = 16 << 20

// get returns n bytes for a result, recycled when a result of its class came back and was not
// dropped since. Their contents are whatever the last user left: the caller overwrites all of
// them.
func (p *resultPool) get(n int) []byte {
	if n == 0 {
		return []byte{}
	}
	k := classOf(n)
	p.mu.Lock()
	defer p.mu.Unlock()
	first := pop(p.free, k)
	if first == nil {
		first = pop(p.victim, k)
	}
	if first == nil {
		first = &make([]byte, classBytes(k))[0]
		p.made++
		if classBytes(k) > recycleDroppedMax {
			runtime.AddCleanup(first, p.forget, weak.Make(first))
		}
	}
	if p.out == nil {
		p.out = make(map[weak.Pointer[byte]]int)
	}
	key := weak.Make(first)
	p.out[key] = n
	if classBytes(k) <= recycleDroppedMax {
		runtime.SetFinalizer(first, func(first *byte) { p.dropped(key, first) })
	}
	return unsafe.Slice(first, n)
}

// pop takes a buffer of class k off lists; nil when it has none.
func pop(lists map[int][]*byte, k int) *byte {
	l := lists[k]
	if len(l) == 0 {
		return nil
	}
	first := l[len(l)-1]
	l[len(l)-1] = nil
	lists[k] = l[:len(l)-1]
	return first
}

// forget drops a collected result too large to recycle from out.
func (p *resultPool) forget(key weak.Pointer[byte]) {
	p.mu.Lock()
	delete(p.out, key)
	p.mu.Unlock()
}

// dropped takes back a result the garbage collector found unreachable (its finalizer): it was
// handed out under key, which no longer matches its buffer, and nothing can read or write it.
func (p *resultPool) dropped(key weak.Pointer[byte], first *byte) {
	p.mu.Lock()
	defer p.mu.Unlock()
	n := p.out[key]
	delete(p.out, key)
	p.pool(first, n)
}

// pool puts the first byte of an n-byte result on the free list of its class; p.mu is held.
func (p *resultPool) pool(first *byte, n int) {
	if p.free == nil {
		p.free = make(map[int][]*byte)
	}
	k := classOf(n)
	p.free[k] = append(p.free[k], first)
	p.watch()
}

// put takes back a result get handed out; false when data is not one (or was given back).
func (p *resultPool) put(data []byte) bool {
	if len(data) == 0 {
		return true // nothing was allocated for an empty result
	}
	first := weak.Make(&data[0])
	p.mu.Lock()
	defer p.mu.Unlock()
	n, ok := p.out[first]
	if !ok || len(data) != n {
		return false
	}
	delete(p.out, first)
	runtime.SetFinalizer(&data[0], nil) // pooled: once dropped from the lists, simply freed
	p.pool(&data[0], n)
	return true
}

// watch arranges for the next garbage collection to call collected, unless one will already.
// The sentinel holds a pointer so that it is not one of the runtime's tiny allocations, whose
// cleanups wait for every object sharing their block.
func (p *resultPool) watch() {
	if !p.watching {
		p.watching = true
		runtime.AddCleanup(new([2]*byte), (*resultPool).collected, p)
	}
}

// collected ages the free lists at a garbage collection: what lay unused since the last one is
// dropped, what came back since becomes the victim list. It keeps watching while either holds
// memory, and stops after: the pending cleanup keeps p (and its Horovod) reachable.
func (p *resultPool) collected() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.free, p.victim = nil, p.free
	p.watching = false
	if len(p.victim) > 0 {
		p.watch()
	}
}

// outstanding counts the results handed out and neither released nor found dropped.
func (p *resultPool) outstanding() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return len(p.out)
}

// Release gives the memory of results back to horovod, which hands it out again, without
// allocating or zeroing, as a later result of about the same size (Allreduce without Output,
// the Grouped ones, Allgather, Broadcast, Reducescatter, Alltoall): what TensorFlow's allocator does for the outputs of
// Horovod's ops once a program drops them. A result must not be read or written after Release,
// which is why it is explicit: a result never released comes back only once a garbage
// collection finds it dropped, and until then every call allocates a new one (at 1 MiB and
// more, in a process with a small live heap, a collection every few calls). Buffers the caller
// reuses (AllreduceOptions.Output, AllgatherInto) are the other way to the same speed.
//
// Each tensor must be a result of this job, whole and not yet released: anything else (the
// caller's own memory, a slice of a result, a second Release before the memory is handed out
// again) is refused with an error and left alone, since recycling memory still in use would
// corrupt a later result. The others are still released. An empty result is accepted and does
// nothing. Release may be called after Shutdown and from any goroutine.
func (h *Horovod) Release(results ...Tensor) error {
	var first error
	for i, t := range results {
		if !h.results.put(t.Data) && first == nil {
			first = fmt.Errorf("horovod: Release: tensor %d of %d (%v%v) is not a result of this job still held by the caller (its own memory, part of a result, or released already)", i, len(results), t.DType, t.Shape)
		}
	}
	return first
}
