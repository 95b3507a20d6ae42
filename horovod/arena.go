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
// an arena makes no host copy at all), else from Go.
type arena struct {
	host backend.HostAllocator // nil: Go memory
	mem  []byte                // the allocation, as AllocHost or make returned it
	buf  []byte                // this step's part of mem
	// old is the backend allocation mem replaced in this step, kept until settle: the step's
	// inputs may lie in it (the previous step's results handed back to Reduce). A replaced Go
	// allocation is the garbage collector's to keep while anything refers to it.
	old []byte
}

// grow makes buf n bytes long, allocating anew (without copying) when mem is too short.
func (a *arena) grow(n int) error {
	if n <= len(a.mem) {
		a.buf = a.mem[:n]
		return nil
	}
	if a.host == nil {
		a.mem = make([]byte, n)
		a.buf = a.mem
		return nil
	}
	if err := a.settle(); err != nil { // a step that failed before settling
		return err
	}
	mem, err := a.host.AllocHost(n)
	if err != nil {
		return fmt.Errorf("horovod: allocating %d bytes of the %s backend's host memory: %w", n, a.host.Name(), err)
	}
	a.old, a.mem, a.buf = a.mem, mem, mem[:n]
	return nil
}

// settle gives back the allocation grow replaced, once the step that might read it is over:
// no collective of the step is in flight any more.
func (a *arena) settle() error {
	old := a.old
	a.old = nil
	if old == nil {
		return nil
	}
	if err := a.host.FreeHost(old); err != nil {
		return fmt.Errorf("horovod: freeing %d bytes of the %s backend's host memory: %w", len(old), a.host.Name(), err)
	}
	return nil
}

// release gives back all of the arena's memory; a later grow allocates anew.
func (a *arena) release() error {
	err := a.settle()
	if a.host != nil && a.mem != nil {
		if e := a.host.FreeHost(a.mem); e != nil {
			err = errors.Join(err, fmt.Errorf("horovod: freeing %d bytes of the %s backend's host memory: %w", len(a.mem), a.host.Name(), e))
		}
	}
	a.mem, a.buf = nil, nil
	return err
}
