package horovod

import (
	"errors"
	"sync"
)

// HostBuffer is host memory for a buffer the caller keeps from step to step and reduces in
// place (a Reducer with InPlace, or collectives whose tensors are views of it), such as a
// training loop's flat gradient buffer. With a data backend that lends host memory its
// collectives move without staging (backend.HostAllocator: the NCCL backend's pinned memory,
// which the GPU reads and writes by DMA), the buffer is that memory, and an allreduce in place
// on it makes no host copy at all; in Go memory the same allreduce costs two copies through the
// backend's staging buffer (for BERT-base on NCCL, most of the gradients' staging time). It is
// the memory a Reducer keeps its own arenas in, offered to the caller for buffers that are
// theirs.
//
// The names follow backend.HostAllocator's AllocHost/FreeHost, which it wraps: Horovod.AllocHost
// is the backend's AllocHost for callers that do not know the backend, and HostBuffer (not a bare
// []byte) because the memory must be given back to the backend that lent it, and its life ends
// with that backend's.
//
// Lifetime: the memory is valid until Free or Shutdown, whichever comes first. Shutdown closes
// the data backend, which frees what it lent: a slice of a lent buffer read or written after
// Shutdown is freed C memory (a crash, or silent corruption), so take what must outlive the job
// out before Shutdown. What horovod can see it refuses with an error, on every backend alike so
// that a mistake shows on the CPU before it crashes on a GPU: after Free or once the job has shut
// down (or its background loop has failed), Bytes returns nil, collectives over the memory return
// ErrShutdown as every collective then does, and a second Free is an error; Free after Shutdown
// does nothing (the backend has freed the memory) and returns nil. There is no finalizer freeing
// it instead of Free: the slices Bytes returns refer to the memory without keeping the
// HostBuffer reachable, so a finalizer could free memory still in use.
//
// Its methods are safe for concurrent use, but the memory is not guarded: as for any buffer, a
// collective on it must be done before it is freed.
type HostBuffer struct {
	h     *Horovod
	mu    sync.Mutex
	mem   arena // one allocation: mem.buf is the buffer
	freed bool
}

// AllocHost returns a HostBuffer of n > 0 bytes, zeroed or not: the data backend's host memory
// when it lends some (backend.HostAllocator), else Go memory. When the backend cannot lend (out
// of pinned memory) it is Go memory too, and the log says why, once per job (as for a Reducer's
// arenas): collectives accept either, Go memory only costs the staging copies. After Shutdown it
// fails with ErrShutdown.
func (h *Horovod) AllocHost(n int) (*HostBuffer, error) {
	if n <= 0 {
		return nil, errors.New("horovod: AllocHost of a non-positive size")
	}
	release, err := h.ctl.hold()
	if err != nil {
		return nil, err
	}
	defer release()
	b := &HostBuffer{h: h, mem: h.hostArena(h.ctl.data)}
	b.mem.grow(n, false)
	return b, nil
}

// Bytes returns the buffer's memory, always the same slice; nil after Free, or once the job
// has shut down (its backend's memory is freed then, see HostBuffer).
func (b *HostBuffer) Bytes() []byte {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.freed {
		return nil
	}
	release, err := b.h.ctl.hold()
	if err != nil {
		return nil
	}
	release()
	return b.mem.buf
}

// Lent reports whether the buffer is the data backend's memory (backend.HostAllocator), false
// when it is Go memory (the backend lends none, or could not lend), and after Free.
func (b *HostBuffer) Lent() bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.mem.lent
}

// Free gives the memory back to the backend that lent it (Go memory is left to the garbage
// collector); no collective on it may be in progress. After Shutdown it does nothing and returns
// nil: the backend freed the memory when it closed. Freeing a buffer twice is an error.
func (b *HostBuffer) Free() error {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.freed {
		return errors.New("horovod: HostBuffer freed twice")
	}
	b.freed = true
	release, err := b.h.ctl.hold()
	if err != nil {
		b.mem.abandon()
		return nil
	}
	defer release()
	return b.mem.release()
}
