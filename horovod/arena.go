package horovod

import (
	"errors"
	"fmt"

	"github.com/gorovod/gorovod/horovod/backend"
)

// arena is host memory reused from step to step: a Reducer's results and float16 wire copies,
// each step's tensors back to back so that fusion reads and writes them in place, and the
// fusion buffer. It comes from the data backend when that lends memory its collectives move
// without staging (backend.HostAllocator: pinned memory for NCCL, where an allreduce in place on
// an arena makes no host copy at all), else from Go. When the backend cannot lend (out of pinned
// memory), the arena uses Go memory, which collectives accept as well, only slower.
type arena struct {
	host backend.HostAllocator // nil: Go memory
	// fallback is told why host could not lend when Go memory is used instead.
	fallback func(error)
	mem      []byte // the allocation, as AllocHost or make returned it
	lent     bool   // mem is host's
	buf      []byte // this step's part of mem
	// old holds the backend allocations mem replaced, kept until settle: the step's inputs may
	// lie in them (the previous step's results handed back to Reduce), and after a failed step
	// the backend may not be done with them. A replaced Go allocation is the garbage collector's
	// to keep while anything refers to it.
	old [][]byte
}

// grow makes buf n bytes long. It allocates anew (without copying) when mem is too short, or
// when fresh is set: this step reads inputs inside mem, which its results must not overwrite.
func (a *arena) grow(n int, fresh bool) {
	if n <= len(a.mem) && !fresh {
		a.buf = a.mem[:n]
		return
	}
	if a.lent {
		a.old = append(a.old, a.mem)
	}
	a.mem, a.lent = a.alloc(n)
	a.buf = a.mem[:n]
}

// alloc returns n bytes of the backend's memory, or of Go's when it has none to lend.
func (a *arena) alloc(n int) ([]byte, bool) {
	if a.host != nil && n > 0 {
		mem, err := a.host.AllocHost(n)
		if err == nil {
			return mem, true
		}
		if a.fallback != nil && !errors.Is(err, backend.ErrNotLending) {
			a.fallback(fmt.Errorf("allocating %d bytes of the %s backend's host memory: %w", n, a.host.Name(), err))
		}
	}
	return make([]byte, n), false
}

// settle gives back the allocations grow replaced, once a step that might read them has
// succeeded: no collective of it is in flight any more.
func (a *arena) settle() error {
	var errs []error
	for _, old := range a.old {
		if err := a.host.FreeHost(old); err != nil {
			errs = append(errs, fmt.Errorf("horovod: freeing %d bytes of the %s backend's host memory: %w", len(old), a.host.Name(), err))
		}
	}
	a.old = nil
	return errors.Join(errs...)
}

// release gives back all of the arena's memory; a later grow allocates anew.
func (a *arena) release() error {
	err := a.settle()
	if a.lent {
		if e := a.host.FreeHost(a.mem); e != nil {
			err = errors.Join(err, fmt.Errorf("horovod: freeing %d bytes of the %s backend's host memory: %w", len(a.mem), a.host.Name(), e))
		}
	}
	a.mem, a.buf, a.lent = nil, nil, false
	return err
}

// abandon forgets the arena's memory without giving it back: the backend has freed it at Close
// (or will), so it must not be touched any more.
func (a *arena) abandon() {
	a.mem, a.buf, a.old, a.lent = nil, nil, nil, false
}

// hostArena is an arena in the data backend's memory when it lends some, telling h's log once
// when it cannot and Go memory is used instead.
func (h *Horovod) hostArena(data backend.Backend) arena {
	host, ok := data.(backend.HostAllocator)
	if !ok {
		return arena{}
	}
	return arena{host: host, fallback: func(err error) {
		h.hostFallback.Do(func() {
			h.log.Printf("%v; using Go memory instead, which the collectives stage through their own buffers (logged once)", err)
		})
	}}
}
