// Package local is the backend of a job of one process: every collective is a copy or nothing,
// and no MPI library is touched. horovod.Init picks it when no launcher started the process.
package local

import (
	"fmt"
	"os"

	"github.com/gorovod/gorovod/horovod/backend"
	"github.com/gorovod/gorovod/horovod/internal/parallel"
)

// Backend is a job of size 1. The zero value is ready to use.
type Backend struct{}

var (
	_ backend.Backend         = Backend{}
	_ backend.ReduceScatterer = Backend{}
	_ backend.Alltoaller      = Backend{}
	_ backend.Splitter        = Backend{}
)

// Name is "local".
func (Backend) Name() string { return "local" }

// Topology is rank 0 of 1 everywhere.
func (Backend) Topology() backend.Topology {
	return backend.Topology{Size: 1, LocalSize: 1, CrossSize: 1}
}

// Allreduce over one rank is the identity.
func (Backend) Allreduce(send, recv []byte, dt backend.DType, op backend.ReduceOp) error {
	if !dt.Valid() || len(send) != len(recv) || len(send)%dt.Size() != 0 {
		return fmt.Errorf("local: allreduce of %d bytes into %d bytes of %v", len(send), len(recv), dt)
	}
	copy(recv, send)
	return nil
}

// Broadcast from rank 0 to itself leaves buf as it is.
func (Backend) Broadcast(buf []byte, root int) error {
	if root != 0 {
		return fmt.Errorf("local: broadcast root %d in a job of size 1", root)
	}
	return nil
}

// Allgatherv of one rank copies send.
func (Backend) Allgatherv(send, recv []byte, counts []int) error {
	if len(counts) != 1 || counts[0] != len(send) || len(recv) != len(send) {
		return fmt.Errorf("local: allgatherv of %d bytes into %d with counts %v", len(send), len(recv), counts)
	}
	copy(recv, send)
	return nil
}

// ReduceScatter over one rank copies send: rank 0's block is the whole reduction.
func (Backend) ReduceScatter(send, recv []byte, counts []int, dt backend.DType, op backend.ReduceOp) error {
	if !dt.Valid() || op < backend.Sum || op > backend.Product || len(counts) != 1 || counts[0]%dt.Size() != 0 ||
		counts[0] != len(send) || len(recv) != len(send) || parallel.Overlap(send, recv) {
		return fmt.Errorf("local: reduce-scatter of %d bytes into %d of %v (%v) with counts %v", len(send), len(recv), dt, op, counts)
	}
	copy(recv, send)
	return nil
}

// Alltoallv of one rank copies send: its one block goes to itself.
func (Backend) Alltoallv(send []byte, sendCounts []int, recv []byte, recvCounts []int) error {
	if len(sendCounts) != 1 || len(recvCounts) != 1 || sendCounts[0] != len(send) || recvCounts[0] != len(recv) ||
		len(recv) != len(send) || parallel.Overlap(send, recv) {
		return fmt.Errorf("local: alltoallv of %d bytes (counts %v) into %d (counts %v)", len(send), sendCounts, len(recv), recvCounts)
	}
	copy(recv, send)
	return nil
}

// Barrier has nobody to wait for.
func (Backend) Barrier() error { return nil }

// Abort exits the process.
func (Backend) Abort(code int) { os.Exit(code) }

// Close has nothing to release.
func (Backend) Close() error { return nil }

// Split of the one rank there is is another job of size 1: a process set of rank 0.
func (Backend) Split(ranks []int) (backend.Backend, error) {
	if len(ranks) != 1 || ranks[0] != 0 {
		return nil, fmt.Errorf("local: process set of ranks %v in a job of size 1", ranks)
	}
	return Backend{}, nil
}
