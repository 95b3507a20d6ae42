package mpi

/*
#include "mpi_shim.h"
*/
import "C"

import (
	"errors"
	"fmt"
	"math"
	"sync/atomic"
	"unsafe"

	"github.com/gorovod/gorovod/horovod/backend"
	"github.com/gorovod/gorovod/horovod/internal/parallel"
)

// communicator is one MPI communicator with its collectives through MPI alone: every collective
// of a Group, and those of a Comm that shared memory does not take. Comm and Group embed it, so
// that both make the same MPI calls, after the same argument checks, past MPI's C-int counts
// the same way.
type communicator struct {
	h    *C.hvd_comm
	topo backend.Topology
	// do runs f, which makes MPI calls over h: a Comm hands it to its MPI thread (or runs it in
	// place under Serve), a Group runs it in place. Once the communicator is closed it returns
	// ErrClosed without running f.
	do func(f func()) error
	// wait: how a rank early in a small allgather waits for its peers.
	wait backend.Wait
	// allreduceChunk: see Comm.AllreduceChunk. allreduceCalls counts MPI_Allreduce calls
	// (Comm.AllreduceCalls).
	allreduceChunk int
	allreduceCalls atomic.Uint64
}

// place records h and this process's place t in it, and chunks large allreduces where every
// rank of h runs on this machine (see SharedMemoryAllreduceChunk).
func (m *communicator) place(h *C.hvd_comm, t *C.hvd_topology) {
	m.h = h
	m.topo = backend.Topology{
		Rank: int(t.rank), Size: int(t.size),
		LocalRank: int(t.local_rank), LocalSize: int(t.local_size),
		CrossRank: int(t.cross_rank), CrossSize: int(t.cross_size),
	}
	if m.topo.LocalSize == m.topo.Size {
		m.allreduceChunk = SharedMemoryAllreduceChunk
	}
}

func (m *communicator) call(name string, f func() C.int) error {
	var rc C.int
	if err := m.do(func() { rc = f() }); err != nil {
		return err
	}
	return mpiError(name, rc)
}

// Name is "mpi".
func (m *communicator) Name() string { return "mpi" }

// Topology is the process's place in the communicator; local means sharing memory with this
// process.
func (m *communicator) Topology() backend.Topology { return m.topo }

// maxCount is the largest element count one MPI call takes (counts are C ints); a variable so
// that a test can make the calls past it with small buffers.
var maxCount = math.MaxInt32

func ptr(b []byte) unsafe.Pointer {
	if len(b) == 0 {
		return nil
	}
	return unsafe.Pointer(&b[0])
}

// checkAllreduce checks an allreduce's buffers against its dtype.
func (m *communicator) checkAllreduce(send, recv []byte, dt backend.DType) error {
	es := dt.Size()
	if es == 0 {
		return fmt.Errorf("mpi: allreduce of invalid dtype %v", dt)
	}
	if len(send) != len(recv) || len(send)%es != 0 {
		return fmt.Errorf("mpi: allreduce of %d bytes into %d bytes of %v", len(send), len(recv), dt)
	}
	return nil
}

// mpiAllreduce is Allreduce through MPI_Allreduce, in calls of at most maxCount elements, and
// of allreduceChunk bytes when that is set; a send aliasing recv is MPI_IN_PLACE.
func (m *communicator) mpiAllreduce(send, recv []byte, dt backend.DType, op backend.ReduceOp) error {
	es := dt.Size()
	inPlace := len(send) > 0 && &send[0] == &recv[0]
	for off := 0; off < len(recv); {
		n := min((len(recv)-off)/es, maxCount)
		if m.allreduceChunk > 0 {
			n = min(n, max(1, m.allreduceChunk/es))
		}
		s, r := send[off:off+n*es], recv[off:off+n*es]
		if inPlace {
			s = r
		}
		m.allreduceCalls.Add(1)
		if err := m.call("MPI_Allreduce", func() C.int {
			return C.hvd_mpi_allreduce(m.h, ptr(s), ptr(r), C.int(n), C.int(dt), C.int(op))
		}); err != nil {
			return err
		}
		off += n * es
	}
	return nil
}

// checkRoot checks a broadcast's root.
func (m *communicator) checkRoot(root int) error {
	if root < 0 || root >= m.topo.Size {
		return fmt.Errorf("mpi: broadcast root %d outside 0..%d", root, m.topo.Size-1)
	}
	return nil
}

// mpiBroadcast is Broadcast through MPI_Bcast, in chunks of at most maxCount bytes.
func (m *communicator) mpiBroadcast(buf []byte, root int) error {
	for off := 0; off < len(buf); {
		n := min(len(buf)-off, maxCount)
		b := buf[off : off+n]
		if err := m.call("MPI_Bcast", func() C.int { return C.hvd_mpi_bcast(m.h, ptr(b), C.int(n), C.int(root)) }); err != nil {
			return err
		}
		off += n
	}
	return nil
}

// mpiAllgatherv is Allgatherv through MPI's blocking MPI_Allgatherv, whose counts and
// displacements are C ints: a result of more than maxCount bytes (2^31-1; Horovod's limit is
// 2^31 elements) goes instead as one broadcast of each rank's part from that rank, which every
// rank, knowing the counts, makes alike.
func (m *communicator) mpiAllgatherv(send, recv []byte, counts []int) error {
	if _, err := m.checkAllgatherv(send, recv, counts); err != nil || len(recv) == 0 {
		return err
	}
	if len(recv) > maxCount {
		return m.allgatherByBroadcasts(send, recv, counts)
	}
	sp, cc := m.allgathervArgs(send, recv, counts)
	return m.call("MPI_Allgatherv", func() C.int {
		return C.hvd_mpi_allgatherv_blocking(m.h, sp, C.int(len(send)), ptr(recv), &cc[0], &cc[len(counts)])
	})
}

// allgatherByBroadcasts is an allgather of any length as one broadcast per rank.
func (m *communicator) allgatherByBroadcasts(send, recv []byte, counts []int) error {
	off := 0
	for p, n := range counts {
		part := recv[off : off+n]
		if p == m.topo.Rank {
			copy(part, send)
		}
		if err := m.mpiBroadcast(part, p); err != nil {
			return err
		}
		off += n
	}
	return nil
}

// allgatherEqual is Allgatherv of parts as long as mine on every rank: every rank's, in rank
// order.
func (m *communicator) allgatherEqual(mine []byte) ([]byte, error) {
	all, counts := make([]byte, len(mine)*m.topo.Size), make([]int, m.topo.Size)
	for r := range counts {
		counts[r] = len(mine)
	}
	if err := m.mpiAllgatherv(mine, all, counts); err != nil {
		return nil, err
	}
	return all, nil
}

// checkNegotiation checks a negotiation round's allgather (NegotiationAllgatherv) and says
// whether a rank that arrives before its peers waits for them sleeping: as the communicator
// was opened with, when every part is at most SleepingWaitMaxPart bytes. The messages of a round
// are small: more than maxCount bytes in all is an error.
func (m *communicator) checkNegotiation(send, recv []byte, counts []int) (sleep bool, err error) {
	largest, err := m.checkAllgatherv(send, recv, counts)
	if err != nil {
		return false, err
	}
	if len(recv) > maxCount {
		return false, fmt.Errorf("mpi: a negotiation round of %d bytes in all, above 2^31-1", len(recv))
	}
	return m.wait == backend.WaitSleep && largest <= SleepingWaitMaxPart, nil
}

// checkAllgatherv checks an allgather's buffers against its counts and returns the largest part.
func (m *communicator) checkAllgatherv(send, recv []byte, counts []int) (largest int, err error) {
	if len(counts) != m.topo.Size {
		return 0, fmt.Errorf("mpi: allgatherv with %d counts for %d ranks", len(counts), m.topo.Size)
	}
	total := 0
	for r, n := range counts {
		if n < 0 {
			return 0, fmt.Errorf("mpi: allgatherv of %d bytes from rank %d", n, r)
		}
		total += n
		largest = max(largest, n)
	}
	if counts[m.topo.Rank] != len(send) || total != len(recv) {
		return 0, fmt.Errorf("mpi: allgatherv sends %d bytes (count %d) into %d bytes (counts total %d)", len(send), counts[m.topo.Rank], len(recv), total)
	}
	return largest, nil
}

// allgathervArgs returns the send pointer and the counts and displacements in C memory layout
// of an allgather that checkAllgatherv passed, of 1 to maxCount bytes in all.
func (m *communicator) allgathervArgs(send, recv []byte, counts []int) (sp unsafe.Pointer, cc []C.int) {
	cc = make([]C.int, 2*len(counts)) // counts, then displacements
	total := 0
	for r, n := range counts {
		cc[r], cc[len(counts)+r] = C.int(n), C.int(total)
		total += n
	}
	// MPI reads the send pointer even for a zero count in some implementations: give it valid memory.
	sp = ptr(send)
	if sp == nil {
		sp = ptr(recv)
	}
	return sp, cc
}

// mpiReduceScatter is ReduceScatter through MPI_Reduce_scatter, of arguments that
// checkReduceScatter passed: rank r receives counts[r] bytes of the reduction, reduced as
// Allreduce reduces through MPI (float16 and bfloat16 by half.go's operators, 8-bit sums
// wrapping around). A tensor of more than maxCount elements goes through allreduce instead
// (see below), the communicator's whole Allreduce.
func (m *communicator) mpiReduceScatter(send, recv []byte, counts []int, dt backend.DType, op backend.ReduceOp, allreduce func(send, recv []byte, dt backend.DType, op backend.ReduceOp) error) error {
	es := dt.Size()
	if len(send)/es > maxCount {
		// The counts are C ints, and Open MPI adds them up in a C int itself (the whole
		// tensor's count, which its Reduce-then-Scatterv algorithm passes to one MPI_Reduce),
		// so even blocks that each fit overflow it once the tensor has more elements than
		// that. Allreduce reduces any length (in calls of at most maxCount elements), at the
		// cost of a result buffer of the whole tensor. Every rank decides alike: on the length
		// of send, which the counts they share fix.
		all := make([]byte, len(send))
		if err := allreduce(send, all, dt, op); err != nil {
			return err
		}
		copy(recv, all[m.blockAt(counts):])
		return nil
	}
	cc := make([]C.int, len(counts))
	for r, n := range counts {
		cc[r] = C.int(n / es) // MPI counts elements
	}
	// An empty recv is a null pointer with a count of 0, which MPI never reads or writes.
	sp, rp := ptr(send), ptr(recv)
	return m.call("MPI_Reduce_scatter", func() C.int {
		return C.hvd_mpi_reduce_scatter(m.h, sp, rp, &cc[0], C.int(dt), C.int(op))
	})
}

// blockAt is the offset in a reduce-scatter's tensor of this rank's block.
func (m *communicator) blockAt(counts []int) int {
	at := 0
	for _, n := range counts[:m.topo.Rank] {
		at += n
	}
	return at
}

// checkReduceScatter checks a reduce-scatter's arguments against backend.ReduceScatterer's
// contract.
func (m *communicator) checkReduceScatter(send, recv []byte, counts []int, dt backend.DType, op backend.ReduceOp) error {
	es := dt.Size()
	if es == 0 {
		return fmt.Errorf("mpi: reduce-scatter of invalid dtype %v", dt)
	}
	if op < backend.Sum || op > backend.Product {
		return fmt.Errorf("mpi: reduce-scatter with invalid op %v", op)
	}
	if len(counts) != m.topo.Size {
		return fmt.Errorf("mpi: reduce-scatter with %d counts for %d ranks", len(counts), m.topo.Size)
	}
	total := 0
	for r, n := range counts {
		if n < 0 || n%es != 0 {
			return fmt.Errorf("mpi: reduce-scatter of %d bytes to rank %d, not a whole number of %v elements", n, r, dt)
		}
		total += n
	}
	if len(send) != total || len(recv) != counts[m.topo.Rank] {
		return fmt.Errorf("mpi: reduce-scatter of %d bytes (counts total %d) into %d bytes (count %d)", len(send), total, len(recv), counts[m.topo.Rank])
	}
	if parallel.Overlap(send, recv) {
		return errors.New("mpi: reduce-scatter with overlapping send and recv")
	}
	return nil
}

// Alltoallv is MPI_Alltoallv of bytes (backend.Alltoaller). Its counts and displacements are C
// ints: a block of more than maxCount bytes (2^31-1), or one that starts past maxCount in its
// buffer, is an error, on this rank only, and a peer whose own counts fit waits for it in
// MPI_Alltoallv (no rank knows the others' counts). horovod never gets there: it knows every
// rank's splits and takes its allgather instead on every rank alike (alltoallFitsCInts).
// (Horovod's MPI alltoall has the same C-int limits.)
func (m *communicator) Alltoallv(send []byte, sendCounts []int, recv []byte, recvCounts []int) error {
	if err := m.checkAlltoallv(send, sendCounts, recv, recvCounts); err != nil {
		return err
	}
	size := m.topo.Size
	cc := make([]C.int, 4*size) // send counts, send displacements, receive counts, receive displacements
	for i, counts := range [][]int{sendCounts, recvCounts} {
		cd, off := cc[2*size*i:], 0
		for r, n := range counts {
			if n > maxCount || off > maxCount {
				return fmt.Errorf("mpi: alltoallv sending %d bytes and receiving %d: %s block %d is %d bytes at offset %d, and MPI_Alltoallv takes counts and displacements of at most %d",
					len(send), len(recv), [2]string{"send", "receive"}[i], r, n, off, maxCount)
			}
			cd[r], cd[size+r] = C.int(n), C.int(off)
			off += n
		}
	}
	// As in allgathervArgs, an empty buffer is given the other one's memory (MPI reads or writes
	// none of it for counts of 0); only where both are empty are they null.
	sp, rp := ptr(send), ptr(recv)
	if sp == nil {
		sp = rp
	}
	if rp == nil {
		rp = sp
	}
	return m.call("MPI_Alltoallv", func() C.int {
		return C.hvd_mpi_alltoallv(m.h, sp, &cc[0], &cc[size], rp, &cc[2*size], &cc[3*size])
	})
}

// checkAlltoallv checks an all-to-all's arguments against backend.Alltoaller's contract, as far
// as one rank can: that recvCounts[r] here equals sendCounts[Rank] on rank r only MPI sees.
func (m *communicator) checkAlltoallv(send []byte, sendCounts []int, recv []byte, recvCounts []int) error {
	if len(sendCounts) != m.topo.Size || len(recvCounts) != m.topo.Size {
		return fmt.Errorf("mpi: alltoallv with %d send and %d receive counts for %d ranks", len(sendCounts), len(recvCounts), m.topo.Size)
	}
	for i, counts := range [][]int{sendCounts, recvCounts} {
		total := 0
		for r, n := range counts {
			if n < 0 {
				return fmt.Errorf("mpi: alltoallv with a %s count of %d bytes for rank %d", [2]string{"send", "receive"}[i], n, r)
			}
			total += n
		}
		if buf := [2][]byte{send, recv}[i]; len(buf) != total {
			return fmt.Errorf("mpi: alltoallv %s buffer of %d bytes for %s counts totalling %d", [2]string{"send", "receive"}[i], len(buf), [2]string{"send", "receive"}[i], total)
		}
	}
	if parallel.Overlap(send, recv) {
		return errors.New("mpi: alltoallv with overlapping send and recv")
	}
	return nil
}

// Barrier is MPI_Barrier.
func (m *communicator) Barrier() error {
	return m.call("MPI_Barrier", func() C.int { return C.hvd_mpi_barrier(m.h) })
}
