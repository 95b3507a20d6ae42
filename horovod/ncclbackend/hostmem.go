package ncclbackend

import (
	"errors"
	"fmt"
	"slices"
	"sync"
	"unsafe"

	"github.com/gorovod/gorovod/nccl"
)

// lentMemory is the pinned memory the backend lends (backend.HostAllocator): horovod keeps a
// Reducer's arenas there, and a collective whose buffer lies inside one of these allocations
// copies it to and from the device by DMA where it is, skipping the staging copy on that side.
//
// Stream.CopyToDevice and CopyToHost take a *nccl.PinnedBuffer and an offset, so a []byte
// handed to a collective is mapped back to its allocation by address: the allocation whose
// range [start, start+size) holds the slice's whole range. Pinned memory is C memory, which
// neither moves nor is freed by Go, so comparing addresses as integers is sound. A slice that is
// only partly inside an allocation cannot arise from one (Go slices do not run past the memory
// they were cut from) and is treated as not lent.
type lentMemory struct {
	mu     sync.Mutex // AllocHost and FreeHost may run on any goroutine, during a collective
	allocs []*nccl.PinnedBuffer
	starts []uintptr // allocs[i]'s first byte, ascending
	closed bool
}

func address(b []byte) uintptr { return uintptr(unsafe.Pointer(unsafe.SliceData(b))) }

// AllocHost returns n bytes of pinned host memory (backend.HostAllocator), valid until FreeHost
// or Close. Collectives on buffers inside it make no host copy on that side. cudaHostAlloc runs
// outside the lock (it may take milliseconds, and synchronizes with the device), so that finding
// lent memory in a collective does not wait for it.
func (b *Backend) AllocHost(n int) ([]byte, error) {
	m := &b.lent
	if m.isClosed() {
		return nil, errors.New("ncclbackend: AllocHost after Close")
	}
	p, err := b.lib.Runtime().AllocPinned(b.device, n)
	if err != nil {
		return nil, fmt.Errorf("ncclbackend: rank %d: %w", b.topo.Rank, err)
	}
	mem := p.Bytes()
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.closed { // Close ran meanwhile
		return nil, errors.Join(errors.New("ncclbackend: AllocHost after Close"), p.Close())
	}
	i, _ := slices.BinarySearch(m.starts, address(mem))
	m.allocs = slices.Insert(m.allocs, i, p)
	m.starts = slices.Insert(m.starts, i, address(mem))
	return mem, nil
}

// FreeHost frees memory AllocHost returned: the whole slice it returned, as
// backend.HostAllocator says (a part of it is refused rather than taken for all of it); after
// Close it does nothing, as Close freed it. cudaFreeHost runs outside the lock, as in AllocHost.
func (b *Backend) FreeHost(buf []byte) error {
	m := &b.lent
	m.mu.Lock()
	if m.closed {
		m.mu.Unlock()
		return nil
	}
	i, found := slices.BinarySearch(m.starts, address(buf))
	if !found || len(buf) != m.allocs[i].Size() {
		m.mu.Unlock()
		return fmt.Errorf("ncclbackend: FreeHost of %d bytes at %#x: not memory AllocHost returned (the whole of an allocation)", len(buf), address(buf))
	}
	p := m.allocs[i]
	m.allocs = slices.Delete(m.allocs, i, i+1)
	m.starts = slices.Delete(m.starts, i, i+1)
	m.mu.Unlock()
	return p.Close()
}

func (m *lentMemory) isClosed() bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.closed
}

// find returns the allocation that holds all of buf and buf's offset in it; ok is false for
// memory that is not lent (Go memory, an empty buf).
func (m *lentMemory) find(buf []byte) (p *nccl.PinnedBuffer, off int, ok bool) {
	if len(buf) == 0 {
		return nil, 0, false
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	at := address(buf)
	i, found := slices.BinarySearch(m.starts, at)
	if !found {
		i-- // the last allocation starting below buf
	}
	if i < 0 || at-m.starts[i]+uintptr(len(buf)) > uintptr(m.allocs[i].Size()) {
		return nil, 0, false
	}
	return m.allocs[i], int(at - m.starts[i]), true
}

// close frees every allocation still lent.
func (m *lentMemory) close() error {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.closed = true
	var errs []error
	for _, p := range m.allocs {
		errs = append(errs, p.Close())
	}
	m.allocs, m.starts = nil, nil
	return errors.Join(errs...)
}
