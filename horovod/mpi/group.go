package mpi

/*
#include "mpi_shim.h"
*/
import "C"

import (
	"errors"
	"fmt"
	"slices"
	"sync"

	"github.com/gorovod/gorovod/horovod/backend"
)

// Group is a communicator over some of a Comm's ranks (Comm.Split), the backend of one of
// horovod's process sets. Its Topology is this process's place in the set: Rank and Size among
// its ranks, local and cross as the Comm's but among them. Its collectives go through MPI alone,
// with the Comm's checks and its ways past MPI's C-int counts (communicator), but neither shared
// memory nor a roll call, whose state is the Comm's. They make their MPI calls in place, on the
// calling goroutine's thread: MPI_THREAD_MULTIPLE lets them overlap the Comm's calls and other
// Groups'. Like every Backend, a Group is driven by one goroutine at a time.
//
// It implements backend.Backend, Negotiator, ReduceScatterer and Alltoaller.
type Group struct {
	communicator
	parent *Comm
	// mu guards closed and is held through every MPI call over the group's communicator, so that
	// the parent's Close, which frees a Group left open, waits for a call in progress and lets
	// none start after it.
	mu     sync.Mutex
	closed bool
}

var (
	_ backend.Splitter        = (*Comm)(nil)
	_ backend.Negotiator      = (*Group)(nil)
	_ backend.ReduceScatterer = (*Group)(nil)
	_ backend.Alltoaller      = (*Group)(nil)
)

// Split makes a Group of ranks (backend.Splitter): MPI_Comm_split of the Comm, a collective of
// all its ranks, made as its other collectives are (on the MPI thread, or in place under Serve).
// ranks are ascending, distinct ranks of the Comm; on a rank not among them Split returns nil.
// Unless the Comm was opened with ProcessSets (MPI_THREAD_MULTIPLE), Split fails: a Group's
// calls overlap the Comm's. Either failure comes before any MPI call, on every rank alike.
func (c *Comm) Split(ranks []int) (backend.Backend, error) {
	if err := checkSplit(ranks, c.topo.Size); err != nil {
		return nil, err
	}
	if !c.threadMultiple {
		return nil, fmt.Errorf("mpi: %w: process sets need the communicator opened for them (DriverConfig.ProcessSets: HOROVOD_DYNAMIC_PROCESS_SETS=1 or sets given to Init): their collectives overlap the job's, which MPI allows at MPI_THREAD_MULTIPLE only, and MPI was initialized without it", backend.ErrCannotSplit)
	}
	member := C.int(0)
	if _, in := slices.BinarySearch(ranks, c.topo.Rank); in {
		member = 1
	}
	var g *Group
	err := c.call("MPI_Comm_split", func() C.int {
		var h *C.hvd_comm
		var t C.hvd_topology
		rc := C.hvd_mpi_split(c.h, member, &h, &t)
		if h != nil {
			// Registered within the call, so that a Close of the Comm, which waits for the
			// calls in progress, finds the Group.
			g = c.newGroup(h, &t)
		}
		return rc
	})
	if err != nil || g == nil {
		return nil, err // not a nil *Group in a non-nil interface
	}
	return g, nil
}

// checkSplit checks Split's ranks against backend.Splitter's contract.
func checkSplit(ranks []int, size int) error {
	if len(ranks) == 0 {
		return errors.New("mpi: split of no ranks")
	}
	for i, r := range ranks {
		if r < 0 || r >= size {
			return fmt.Errorf("mpi: split of ranks %v: rank %d outside 0..%d", ranks, r, size-1)
		}
		if i > 0 && r <= ranks[i-1] {
			return fmt.Errorf("mpi: split of ranks %v: not ascending and distinct", ranks)
		}
	}
	return nil
}

// newGroup makes the Group of communicator h, where this process's place is t, and registers
// it with c for freeGroups.
func (c *Comm) newGroup(h *C.hvd_comm, t *C.hvd_topology) *Group {
	g := &Group{parent: c}
	g.place(h, t)
	g.wait, g.do = c.wait, g.inPlace
	c.groupsMu.Lock()
	c.groups = append(c.groups, g)
	c.groupsMu.Unlock()
	return g
}

// freeGroups frees the Groups split from c and still open, before MPI_Finalize: after it, a
// Group's call would be an MPI call after MPI_Finalize, which aborts the process. They are freed
// in the order of their splits, the same on every rank.
func (c *Comm) freeGroups() error {
	c.groupsMu.Lock()
	open := c.groups
	c.groups = nil
	c.groupsMu.Unlock()
	var errs []error
	for _, g := range open {
		// ErrClosed: the Group's own Close freed it meanwhile.
		if err := g.free(); err != nil && !errors.Is(err, ErrClosed) {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// inPlace runs f, which makes MPI calls over the group's communicator, on the calling
// goroutine's thread.
func (g *Group) inPlace(f func()) error {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.closed {
		return ErrClosed
	}
	f()
	return nil
}

// Allreduce is MPI_Allreduce over the group, in calls of at most 2^31-1 elements (and of 4 MiB
// where every rank of the group runs on this machine, see SharedMemoryAllreduceChunk); a send
// aliasing recv is MPI_IN_PLACE.
func (g *Group) Allreduce(send, recv []byte, dt backend.DType, op backend.ReduceOp) error {
	if err := g.checkAllreduce(send, recv, dt); err != nil {
		return err
	}
	return g.mpiAllreduce(send, recv, dt, op)
}

// Broadcast is MPI_Bcast over the group, from the group's rank root, in chunks of at most
// 2^31-1 bytes.
func (g *Group) Broadcast(buf []byte, root int) error {
	if err := g.checkRoot(root); err != nil {
		return err
	}
	return g.mpiBroadcast(buf, root)
}

// Allgatherv is MPI_Allgatherv over the group; past 2^31-1 bytes in all, one broadcast per rank
// (see mpiAllgatherv).
func (g *Group) Allgatherv(send, recv []byte, counts []int) error {
	return g.mpiAllgatherv(send, recv, counts)
}

// NegotiationAllgatherv is Allgatherv for the negotiation rounds of the group's process set
// (backend.Negotiator). Where the Comm's would wait sleeping (see checkNegotiation), it is an
// MPI_Iallgatherv tested with sleeps in between, so that a rank early in a round leaves its core
// to its peers' computation; otherwise MPI's blocking MPI_Allgatherv, which polls as the Comm's
// tests without pause do.
func (g *Group) NegotiationAllgatherv(send, recv []byte, counts []int) error {
	sleeping, err := g.checkNegotiation(send, recv, counts)
	if err != nil || len(recv) == 0 {
		return err
	}
	if !sleeping {
		return g.mpiAllgatherv(send, recv, counts)
	}
	sp, cc := g.allgathervArgs(send, recv, counts)
	return g.call("MPI_Iallgatherv", func() C.int {
		return C.hvd_mpi_allgatherv_sleeping(g.h, sp, C.int(len(send)), ptr(recv), &cc[0], &cc[len(counts)])
	})
}

// ReduceScatter is MPI_Reduce_scatter over the group (backend.ReduceScatterer), as
// mpiReduceScatter makes it: past 2^31-1 elements, the group's Allreduce.
func (g *Group) ReduceScatter(send, recv []byte, counts []int, dt backend.DType, op backend.ReduceOp) error {
	// Every rank passes the same counts, so every rank leaves an empty tensor alike.
	if err := g.checkReduceScatter(send, recv, counts, dt, op); err != nil || len(send) == 0 {
		return err
	}
	return g.mpiReduceScatter(send, recv, counts, dt, op, g.mpiAllreduce)
}

// Abort is the parent Comm's Abort, which ends every process of the job, as backend.Backend
// asks, not only the group's.
func (g *Group) Abort(code int) { g.parent.Abort(code) }

// Close frees the group's communicator (MPI_Comm_free) on the calling goroutine's thread. A
// second Close, and one after the parent's Close freed it, returns ErrClosed.
func (g *Group) Close() error {
	err := g.free()
	c := g.parent
	c.groupsMu.Lock()
	c.groups = slices.DeleteFunc(c.groups, func(o *Group) bool { return o == g })
	c.groupsMu.Unlock()
	return err
}

// free frees the group's communicator, once, after the call in progress if any.
func (g *Group) free() error {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.closed {
		return ErrClosed
	}
	g.closed = true
	rc := C.hvd_mpi_comm_free(g.h)
	g.h = nil
	return mpiError("MPI_Comm_free", rc)
}
