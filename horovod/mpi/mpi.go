// Package mpi is horovod's backend over OpenMPI. MPI is initialized and finalized on one
// dedicated, locked OS thread, which makes every MPI call of the process but those of horovod's
// negotiation rounds; a round (run by horovod's background loop, or by the caller of a blocking
// operation) makes its own calls wherever Go runs it (see Serve). No two calls ever overlap, so
// MPI_THREAD_SERIALIZED is all it asks of the library. float16
// and bfloat16 reductions go through custom MPI operators backed by packages fp16 and bf16.
//
// A rank that reaches a small allgather (horovod's negotiation rounds) before its peers waits for
// them sleeping rather than polling, unless it is opened with backend.WaitSpin
// (GOROVOD_MPI_WAIT=spin, read by horovod): its peers may still be computing on the cores its
// polling would take.
//
// Importing the package registers it with package backend as the "mpi" driver, which
// horovod.Init opens under a launcher; package horovod does not import it, so a program that runs
// under mpirun imports it, for its side effect if for nothing else:
//
//	import _ "github.com/gorovod/gorovod/horovod/mpi"
//
// The package links libmpi through pkg-config (Debian: libopenmpi-dev). A process opens the
// backend at most once: MPI cannot be initialized again after it is finalized.
package mpi

/*
#cgo pkg-config: ompi-c
#include <stdlib.h>
#include "mpi_shim.h"
*/
import "C"

import (
	"crypto/rand"
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"os"
	"runtime"
	"sync"
	"sync/atomic"
	"time"
	"unsafe"

	"github.com/gorovod/gorovod/horovod/backend"
	"github.com/gorovod/gorovod/horovod/internal/parallel"
	"github.com/gorovod/gorovod/horovod/internal/peerprobe"
)

func init() {
	backend.Register("mpi", func(cfg backend.DriverConfig) (backend.Backend, error) {
		c, err := Open(cfg)
		if err != nil {
			return nil, err // not a nil *Comm in a non-nil interface
		}
		return c, nil
	})
}

// Error is an MPI call that failed, with MPI's own text for the code.
type Error struct {
	Call string // the MPI function, e.g. "MPI_Allreduce"
	Code int
	Text string
}

func (e *Error) Error() string {
	return fmt.Sprintf("mpi: %s failed (code %d): %s", e.Call, e.Code, e.Text)
}

func mpiError(call string, rc C.int) error {
	if rc == 0 {
		return nil
	}
	buf := (*C.char)(C.malloc(512))
	defer C.free(unsafe.Pointer(buf))
	C.hvd_mpi_error_string(rc, buf, 512)
	return &Error{Call: call, Code: int(rc), Text: C.GoString(buf)}
}

// ErrClosed is returned by calls on a Comm after Close.
var ErrClosed = errors.New("mpi: communicator is closed")

var opened sync.Once

// SleepingWaitMaxPart is the largest part of one rank for which an allgather waits sleeping:
// OpenMPI sends a part this small in one message when the collective is posted (its shared-memory
// eager limit), so the collective needs no progress but its completion, and the sleeps only decide
// how soon that is noticed. Larger parts move in steps that each need both sides to test.
const SleepingWaitMaxPart = 4096

// Comm is MPI_COMM_WORLD (duplicated, so that horovod's traffic never matches the application's),
// driven from its own OS thread. It implements backend.Backend, ThreadBound, Negotiator, RollCall,
// PeerProber, HostAllocator, PathReporter, OverlappedBroadcaster, ReduceScatterer and Alltoaller.
type Comm struct {
	topo  backend.Topology
	calls chan func()
	// mu guards closed: Do holds it for reading while its call is on the MPI thread, Close for
	// writing as it marks the Comm closed, so that no call reaches the thread after Close has
	// begun, and a second Close does not finalize again.
	mu     sync.RWMutex
	closed bool
	// serving is set while Serve runs a loop: that loop is then the only
	// caller, and its calls run in place.
	serving atomic.Bool
	// wait: how a rank early in a small allgather waits for its peers.
	wait backend.Wait
	// allreduceChunk: see AllreduceChunk. allreduceCalls counts MPI_Allreduce calls (AllreduceCalls),
	// reduceScatters ReduceScatter's (ReduceScatters).
	allreduceChunk int
	allreduceCalls atomic.Uint64
	reduceScatters atomic.Uint64
	// probeListener answers the peers' probes; peers are where to probe them (probe.go).
	probeListener *peerprobe.Listener
	peers         []peerprobe.Peer
	// shm is the memory the ranks lend each other when the whole job runs on this machine
	// (shm.go), nil otherwise; lastPath says how the last Allreduce went (AllreducePath),
	// lastBroadcastPath how the last broadcast did (BroadcastPath), lastGatherPath the last
	// Allgatherv (AllgatherPath), lastReduceScatterPath the last ReduceScatter
	// (ReduceScatterPath).
	shm                   *sharedMemory
	lastPath              string
	lastBroadcastPath     string
	lastGatherPath        string
	lastReduceScatterPath string
}

var (
	_ backend.ThreadBound     = (*Comm)(nil)
	_ backend.RollCall        = (*Comm)(nil)
	_ backend.HostAllocator   = (*Comm)(nil)
	_ backend.PathReporter    = (*Comm)(nil)
	_ backend.ReduceScatterer = (*Comm)(nil)
	_ backend.Alltoaller      = (*Comm)(nil)
)

// Open initializes MPI on a new dedicated OS thread and returns the world communicator, whose
// small allgathers wait as cfg says. It fails if called a second time in the same process.
func Open(cfg backend.DriverConfig) (*Comm, error) {
	first := false
	opened.Do(func() { first = true })
	if !first {
		return nil, errors.New("mpi: Open called twice: MPI can be initialized once per process")
	}
	c := &Comm{calls: make(chan func()), wait: cfg.Wait}
	ready := make(chan error)
	go c.serve(ready)
	if err := <-ready; err != nil {
		return nil, err
	}
	if err := c.openProbe(); err != nil {
		c.Close()
		return nil, err
	}
	if c.topo.LocalSize == c.topo.Size && c.topo.Size > 1 {
		// The segments' names carry a nonce of the job's, rank 0's, so that two jobs on one
		// machine never open each other's, and their owner's process ID, which every rank
		// learns here, so that a later job can remove the files of one that died.
		nonce := make([]byte, 8)
		if c.topo.Rank == 0 {
			rand.Read(nonce)
		}
		var pids []byte
		err := c.Broadcast(nonce, 0)
		if err == nil {
			pids, err = c.allgatherEqual(binary.LittleEndian.AppendUint64(nil, uint64(os.Getpid())))
		}
		if err != nil {
			c.Close()
			return nil, err
		}
		c.shm = newSharedMemory(binary.LittleEndian.Uint64(nonce), c.topo.Rank, c.topo.Size, pids)
		removeDeadSegments(sharedDir)
	}
	return c, nil
}

// serve is the MPI thread: it initializes MPI, then runs the calls sent to it until Close.
func (c *Comm) serve(ready chan<- error) {
	// Never unlocked: when serve returns after MPI_Finalize, the thread exits with it.
	runtime.LockOSThread()
	var t C.hvd_topology
	if err := mpiError("MPI_Init_thread", C.hvd_mpi_init(&t)); err != nil {
		ready <- err
		return
	}
	if t.thread_level < C.hvd_mpi_thread_serialized() {
		ready <- fmt.Errorf("mpi: the library provides thread level %d, below MPI_THREAD_SERIALIZED", int(t.thread_level))
		return
	}
	c.topo = backend.Topology{
		Rank: int(t.rank), Size: int(t.size),
		LocalRank: int(t.local_rank), LocalSize: int(t.local_size),
		CrossRank: int(t.cross_rank), CrossSize: int(t.cross_size),
	}
	if c.topo.LocalSize == c.topo.Size {
		c.allreduceChunk = SharedMemoryAllreduceChunk
	}
	ready <- nil
	for f := range c.calls {
		f()
	}
}

// Do runs f on the MPI thread and waits for it. It is the way for code with MPI calls of its own
// (a cgo benchmark reference, a test's raw MPI cross-check) to respect the thread model. While
// horovod's background loop drives this Comm, f must not make collective calls: they would
// interleave with horovod's on the other ranks. While Serve runs, Do runs f in place: only a
// negotiation round may call it then.
func (c *Comm) Do(f func()) error {
	if c.serving.Load() {
		f()
		return nil
	}
	c.mu.RLock()
	defer c.mu.RUnlock()
	if c.closed {
		return ErrClosed
	}
	done := make(chan struct{})
	c.calls <- func() {
		defer close(done)
		f()
	}
	<-done
	return nil
}

// Serve runs loop on the calling goroutine; meanwhile the Comm's methods make their MPI calls
// directly, on the caller's thread, without a hand-over per call. Only horovod's negotiation
// rounds (loop's, or a blocking operation's caller's) may call the Comm meanwhile, one at a time.
//
// The rounds do not run on the MPI thread: a goroutine locked to an OS thread hands its processor
// to another thread whenever it blocks, so every call would cost two thread wake-ups, the larger
// part of a small allreduce's latency on a loaded machine. MPI_THREAD_SERIALIZED allows calls
// from any thread as long as none overlap, which horovod's one round at a time guarantees (the
// mutex that serializes rounds orders their calls across threads); Init and Finalize stay on the
// MPI thread, as MPI requires.
func (c *Comm) Serve(loop func()) {
	c.serving.Store(true)
	defer c.serving.Store(false)
	loop()
}

func (c *Comm) call(name string, f func() C.int) error {
	var rc C.int
	if err := c.Do(func() { rc = f() }); err != nil {
		return err
	}
	return mpiError(name, rc)
}

// Name is "mpi".
func (c *Comm) Name() string { return "mpi" }

// Topology is the process's place in MPI_COMM_WORLD; local means sharing memory with this process.
func (c *Comm) Topology() backend.Topology { return c.topo }

// maxCount is the largest element count one MPI call takes (counts are C ints); a variable so
// that a test can make the calls past it with small buffers.
var maxCount = math.MaxInt32

func ptr(b []byte) unsafe.Pointer {
	if len(b) == 0 {
		return nil
	}
	return unsafe.Pointer(&b[0])
}

// SharedMemoryAllreduceChunk is the most bytes one MPI_Allreduce call reduces when every rank
// runs on this machine: a larger allreduce goes as several calls, each over the next chunk
// (rounded down to whole elements). OpenMPI 4.1 over shared memory reduces a large buffer faster
// that way than in one call: on the 2-core Xeon, 2 ranks, 64 MiB of float32 took 46 ms in one
// call and 30 ms in 4 MiB calls (in place 36 -> 21 ms; 256 MiB 173 -> 127 ms; 3 ranks, 64 MiB
// 125 -> 87 ms), under each of its allreduce algorithms that it picks for such sizes
// (coll_tuned_allreduce_algorithm 3-6; the two simplest, 1 and 2, gain little), while 16 MiB and
// less takes as long either way and 1 MiB calls begin to lose at 16 MiB. Between machines over
// TCP the same calls are slower (2 simulated machines at 1 Gbit/s: 64 MiB 0.59 s in one call,
// 1.06 s in 4 MiB calls), so a job on several machines makes one call. Every rank decides alike:
// on the length and the job's layout only.
const SharedMemoryAllreduceChunk = 4 << 20

// Allreduce sums over shared memory when every rank runs on this machine, for sums of
// SharedAllreduceMinBytes and more (see sharedMemory); otherwise
// it reduces with MPI, in calls of at most 2^31-1 elements, and of AllreduceChunk bytes when
// that is set; a send aliasing recv is MPI_IN_PLACE.
func (c *Comm) Allreduce(send, recv []byte, dt backend.DType, op backend.ReduceOp) error {
	es := dt.Size()
	if es == 0 {
		return fmt.Errorf("mpi: allreduce of invalid dtype %v", dt)
	}
	if len(send) != len(recv) || len(send)%es != 0 {
		return fmt.Errorf("mpi: allreduce of %d bytes into %d bytes of %v", len(send), len(recv), dt)
	}
	c.lastPath = ""
	if c.shm != nil && len(recv) >= SharedAllreduceMinBytes && op == backend.Sum {
		done, err := c.sharedAllreduce(send, recv, dt)
		if done {
			c.lastPath = "SHM"
		}
		if done || err != nil {
			return err
		}
	}
	return c.mpiAllreduce(send, recv, dt, op)
}

// mpiAllreduce is Allreduce through MPI_Allreduce.
func (c *Comm) mpiAllreduce(send, recv []byte, dt backend.DType, op backend.ReduceOp) error {
	es := dt.Size()
	inPlace := len(send) > 0 && &send[0] == &recv[0]
	for off := 0; off < len(recv); {
		n := min((len(recv)-off)/es, maxCount)
		if c.allreduceChunk > 0 {
			n = min(n, max(1, c.allreduceChunk/es))
		}
		s, r := send[off:off+n*es], recv[off:off+n*es]
		if inPlace {
			s = r
		}
		c.allreduceCalls.Add(1)
		if err := c.call("MPI_Allreduce", func() C.int {
			return C.hvd_mpi_allreduce(ptr(s), ptr(r), C.int(n), C.int(dt), C.int(op))
		}); err != nil {
			return err
		}
		off += n * es
	}
	return nil
}

// Broadcast sends root's buf over shared memory when every rank runs on this machine and buf
// is SharedBroadcastMinBytes or longer (SharedBroadcastMinBytes2 in a job of 2 ranks; see
// sharedBroadcast), otherwise with MPI in chunks of at most 2^31-1 bytes.
func (c *Comm) Broadcast(buf []byte, root int) error {
	if done, err := c.broadcastShared(buf, root); done || err != nil {
		return err
	}
	return c.mpiBroadcast(buf, root)
}

// mpiBroadcast is Broadcast through MPI_Bcast, in chunks of at most maxCount bytes.
func (c *Comm) mpiBroadcast(buf []byte, root int) error {
	for off := 0; off < len(buf); {
		n := min(len(buf)-off, maxCount)
		b := buf[off : off+n]
		if err := c.call("MPI_Bcast", func() C.int { return C.hvd_mpi_bcast(ptr(b), C.int(n), C.int(root)) }); err != nil {
			return err
		}
		off += n
	}
	return nil
}

// BroadcastWhile is Broadcast with during run meanwhile (backend.OverlappedBroadcaster): every
// chunk's MPI_Ibcast is started, then during runs on this thread, then the broadcasts are waited
// for. Over shared memory a large message's receivers read the root's buffer themselves, so the
// root's thread is free for during instead of polling in MPI_Bcast.
//
// Over shared memory (as Broadcast) nothing is in flight to overlap: during runs after it.
func (c *Comm) BroadcastWhile(buf []byte, root int, during func()) error {
	if done, err := c.broadcastShared(buf, root); done || err != nil {
		if err == nil {
			during()
		}
		return err
	}
	var errs []error
	// MPI holds buf between MPI_Ibcast's return and the wait, while during runs Go code: cgo's
	// rules ask for the memory to be pinned for that long (a no-op for memory outside Go's heap).
	var pin runtime.Pinner
	defer pin.Unpin()
	if len(buf) > 0 {
		pin.Pin(&buf[0])
	}
	err := c.Do(func() {
		var reqs []unsafe.Pointer
		for off := 0; off < len(buf); {
			n := min(len(buf)-off, maxCount)
			var req unsafe.Pointer
			rc := C.hvd_mpi_ibcast(ptr(buf[off:off+n]), C.int(n), C.int(root), &req)
			if err := mpiError("MPI_Ibcast", rc); err != nil {
				errs = append(errs, err)
				break
			}
			reqs = append(reqs, req)
			off += n
		}
		if errs == nil {
			during()
		}
		for _, req := range reqs {
			if err := mpiError("MPI_Wait", C.hvd_mpi_wait(req)); err != nil {
				errs = append(errs, err)
			}
		}
	})
	if err != nil {
		return err
	}
	return errors.Join(errs...)
}

// broadcastShared checks root and makes the broadcast over shared memory where Broadcast's
// doc says it goes there; done is false when MPI is to make it.
func (c *Comm) broadcastShared(buf []byte, root int) (done bool, err error) {
	if root < 0 || root >= c.topo.Size {
		return false, fmt.Errorf("mpi: broadcast root %d outside 0..%d", root, c.topo.Size-1)
	}
	c.lastBroadcastPath = ""
	if c.shm == nil || len(buf) < sharedBroadcastMin(c.topo.Size) {
		return false, nil
	}
	done, err = c.sharedBroadcast(buf, root)
	if done {
		c.lastBroadcastPath = "SHM"
	}
	return done, err
}

// Allgatherv gathers every rank's part into recv on every rank: horovod's data allgathers,
// which every rank enters once negotiation has agreed on them. It goes over shared memory when
// every rank runs on this machine and the result is SharedAllgatherMinBytes or longer
// (SharedAllgatherMinBytes2 in a job of 2 ranks; sharedAllgatherv), otherwise through MPI
// (mpiAllgatherv). Negotiation rounds go through NegotiationAllgatherv.
func (c *Comm) Allgatherv(send, recv []byte, counts []int) error {
	c.lastGatherPath = ""
	if c.shm != nil && sharedAllgather(c.topo.Size, len(recv)) {
		if _, err := c.checkAllgatherv(send, recv, counts); err != nil {
			return err
		}
		done, err := c.sharedAllgatherv(send, recv, counts)
		if done {
			c.lastGatherPath = "SHM"
		}
		if done || err != nil {
			return err
		}
	}
	return c.mpiAllgatherv(send, recv, counts)
}

// mpiAllgatherv is Allgatherv through MPI's blocking MPI_Allgatherv, whose counts and
// displacements are C ints: a result of more than maxCount bytes (2^31-1; Horovod's limit is
// 2^31 elements) goes instead as one broadcast of each rank's part from that rank, which every
// rank, knowing the counts, makes alike.
func (c *Comm) mpiAllgatherv(send, recv []byte, counts []int) error {
	if _, err := c.checkAllgatherv(send, recv, counts); err != nil || len(recv) == 0 {
		return err
	}
	if len(recv) > maxCount {
		return c.allgatherByBroadcasts(send, recv, counts)
	}
	sp, cc := c.allgathervArgs(send, recv, counts)
	return c.call("MPI_Allgatherv", func() C.int {
		return C.hvd_mpi_allgatherv_blocking(sp, C.int(len(send)), ptr(recv), &cc[0], &cc[len(counts)])
	})
}

// allgatherByBroadcasts is an allgather of any length as one broadcast per rank.
func (c *Comm) allgatherByBroadcasts(send, recv []byte, counts []int) error {
	off := 0
	for p, n := range counts {
		part := recv[off : off+n]
		if p == c.topo.Rank {
			copy(part, send)
		}
		if err := c.mpiBroadcast(part, p); err != nil {
			return err
		}
		off += n
	}
	return nil
}

// allgatherEqual is Allgatherv of parts as long as mine on every rank: every rank's, in rank
// order.
func (c *Comm) allgatherEqual(mine []byte) ([]byte, error) {
	all, counts := make([]byte, len(mine)*c.topo.Size), make([]int, c.topo.Size)
	for r := range counts {
		counts[r] = len(mine)
	}
	if err := c.mpiAllgatherv(mine, all, counts); err != nil {
		return nil, err
	}
	return all, nil
}

// NegotiationAllgatherv is Allgatherv for horovod's negotiation rounds (backend.Negotiator):
// MPI_Iallgatherv, tested until it completes. When every part is at most SleepingWaitMaxPart
// bytes, a rank that arrives before its peers waits for them as the Comm was opened with
// (backend.DriverConfig.Wait). Its roll call tells Reached who has entered it. The messages of
// a round are small: more than maxCount bytes in all is an error.
func (c *Comm) NegotiationAllgatherv(send, recv []byte, counts []int) error {
	largest, err := c.checkAllgatherv(send, recv, counts)
	if err != nil || len(recv) == 0 {
		return err
	}
	if len(recv) > maxCount {
		return fmt.Errorf("mpi: a negotiation round of %d bytes in all, above 2^31-1", len(recv))
	}
	sleep := C.int(0)
	if c.wait == backend.WaitSleep && largest <= SleepingWaitMaxPart {
		sleep = 1
	}
	sp, cc := c.allgathervArgs(send, recv, counts)
	return c.call("MPI_Iallgatherv", func() C.int {
		return C.hvd_mpi_allgatherv(sp, C.int(len(send)), ptr(recv), &cc[0], &cc[len(counts)], sleep)
	})
}

// checkAllgatherv checks an allgather's buffers against its counts and returns the largest part.
func (c *Comm) checkAllgatherv(send, recv []byte, counts []int) (largest int, err error) {
	if len(counts) != c.topo.Size {
		return 0, fmt.Errorf("mpi: allgatherv with %d counts for %d ranks", len(counts), c.topo.Size)
	}
	total := 0
	for r, n := range counts {
		if n < 0 {
			return 0, fmt.Errorf("mpi: allgatherv of %d bytes from rank %d", n, r)
		}
		total += n
		largest = max(largest, n)
	}
	if counts[c.topo.Rank] != len(send) || total != len(recv) {
		return 0, fmt.Errorf("mpi: allgatherv sends %d bytes (count %d) into %d bytes (counts total %d)", len(send), counts[c.topo.Rank], len(recv), total)
	}
	return largest, nil
}

// allgathervArgs returns the send pointer and the counts and displacements in C memory layout
// of an allgather that checkAllgatherv passed, of 1 to maxCount bytes in all.
func (c *Comm) allgathervArgs(send, recv []byte, counts []int) (sp unsafe.Pointer, cc []C.int) {
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

// ReduceScatter is MPI_Reduce_scatter (backend.ReduceScatterer): rank r receives counts[r]
// bytes of the reduction, reduced as Allreduce reduces through MPI (float16 and bfloat16 by
// half.go's operators, 8-bit sums wrapping around). A tensor of more than maxCount elements goes
// as an Allreduce instead (see below).
func (c *Comm) ReduceScatter(send, recv []byte, counts []int, dt backend.DType, op backend.ReduceOp) error {
	// Every rank passes the same counts, so every rank leaves an empty tensor alike.
	if err := c.checkReduceScatter(send, recv, counts, dt, op); err != nil || len(send) == 0 {
		return err
	}
	c.reduceScatters.Add(1)
	c.lastReduceScatterPath = ""
	at := 0 // this rank's block's offset in the tensor
	for _, n := range counts[:c.topo.Rank] {
		at += n
	}
	es := dt.Size()
	if len(send)/es > maxCount {
		// The counts are C ints, and Open MPI adds them up in a C int itself (the whole
		// tensor's count, which its Reduce-then-Scatterv algorithm passes to one MPI_Reduce),
		// so even blocks that each fit overflow it once the tensor has more elements than
		// that. Allreduce reduces any length (in calls of at most maxCount elements), at the
		// cost of a result buffer of the whole tensor. Every rank decides alike: on the length
		// of send, which the counts they share fix.
		all := make([]byte, len(send))
		if err := c.Allreduce(send, all, dt, op); err != nil {
			return err
		}
		copy(recv, all[at:])
		return nil
	}
	if c.shm != nil && op == backend.Sum && len(send) >= c.shm.stagedMin {
		done, err := c.sharedReduceScatter(send, recv, at, dt)
		if done {
			c.lastReduceScatterPath = "SHM"
		}
		if done || err != nil {
			return err
		}
	}
	cc := make([]C.int, len(counts))
	for r, n := range counts {
		cc[r] = C.int(n / es) // MPI counts elements
	}
	// An empty recv is a null pointer with a count of 0, which MPI never reads or writes.
	sp, rp := ptr(send), ptr(recv)
	return c.call("MPI_Reduce_scatter", func() C.int {
		return C.hvd_mpi_reduce_scatter(sp, rp, &cc[0], C.int(dt), C.int(op))
	})
}

// checkReduceScatter checks a reduce-scatter's arguments against backend.ReduceScatterer's
// contract.
func (c *Comm) checkReduceScatter(send, recv []byte, counts []int, dt backend.DType, op backend.ReduceOp) error {
	es := dt.Size()
	if es == 0 {
		return fmt.Errorf("mpi: reduce-scatter of invalid dtype %v", dt)
	}
	if op < backend.Sum || op > backend.Product {
		return fmt.Errorf("mpi: reduce-scatter with invalid op %v", op)
	}
	if len(counts) != c.topo.Size {
		return fmt.Errorf("mpi: reduce-scatter with %d counts for %d ranks", len(counts), c.topo.Size)
	}
	total := 0
	for r, n := range counts {
		if n < 0 || n%es != 0 {
			return fmt.Errorf("mpi: reduce-scatter of %d bytes to rank %d, not a whole number of %v elements", n, r, dt)
		}
		total += n
	}
	if len(send) != total || len(recv) != counts[c.topo.Rank] {
		return fmt.Errorf("mpi: reduce-scatter of %d bytes (counts total %d) into %d bytes (count %d)", len(send), total, len(recv), counts[c.topo.Rank])
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
func (c *Comm) Alltoallv(send []byte, sendCounts []int, recv []byte, recvCounts []int) error {
	if err := c.checkAlltoallv(send, sendCounts, recv, recvCounts); err != nil {
		return err
	}
	size := c.topo.Size
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
	return c.call("MPI_Alltoallv", func() C.int {
		return C.hvd_mpi_alltoallv(sp, &cc[0], &cc[size], rp, &cc[2*size], &cc[3*size])
	})
}

// checkAlltoallv checks an all-to-all's arguments against backend.Alltoaller's contract, as far
// as one rank can: that recvCounts[r] here equals sendCounts[Rank] on rank r only MPI sees.
func (c *Comm) checkAlltoallv(send []byte, sendCounts []int, recv []byte, recvCounts []int) error {
	if len(sendCounts) != c.topo.Size || len(recvCounts) != c.topo.Size {
		return fmt.Errorf("mpi: alltoallv with %d send and %d receive counts for %d ranks", len(sendCounts), len(recvCounts), c.topo.Size)
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

// Reached is the roll call of the NegotiationAllgatherv in progress: every rank that waits in one past the spin of the sleeping wait (50 us) tells
// rank 0 that it has entered it, and rank 0 tells every rank. So once a round has waited that
// long, rank 0 knows who has reached it, and the others know about rank 0 and themselves only.
// A round that no rank waits for sends no note (see RollCalls).
func (c *Comm) Reached() (reached, unknown []int, ok bool) {
	if C.hvd_mpi_tracking() == 0 {
		return nil, nil, false
	}
	for r := range c.topo.Size {
		switch {
		case C.hvd_mpi_reached(C.int(r)) != 0:
			reached = append(reached, r)
		case c.topo.Rank != 0 && r != 0:
			unknown = append(unknown, r)
		}
	}
	return reached, unknown, true
}

// RollCalls reads how many Allgathervs this process has made and how many of them took a roll
// call (see Reached): the rest completed within the spin, with no message beyond their own.
func (c *Comm) RollCalls() (allgathers, called uint64) {
	var a, n C.uint64_t
	C.hvd_mpi_roll_call_stats(&a, &n)
	return uint64(a), uint64(n)
}

// AllreduceChunk is the most bytes one of Allreduce's MPI_Allreduce calls reduces: 4 MiB when
// every rank of the job runs on this machine (see SharedMemoryAllreduceChunk), 0 (no limit but
// MPI's count) otherwise.
func (c *Comm) AllreduceChunk() int { return c.allreduceChunk }

// AllreduceCalls is how many MPI_Allreduce calls this process has made through Allreduce (several
// per allreduce longer than AllreduceChunk).
func (c *Comm) AllreduceCalls() uint64 { return c.allreduceCalls.Load() }

// ReduceScatters is how many non-empty reduce-scatters this process has made through
// ReduceScatter, whichever way each went: a fused group of horovod's reducescatters is one.
func (c *Comm) ReduceScatters() uint64 { return c.reduceScatters.Load() }

// Barrier is MPI_Barrier.
func (c *Comm) Barrier() error {
	return c.call("MPI_Barrier", func() C.int { return C.hvd_mpi_barrier() })
}

// abortGrace is how long Abort lets MPI_Abort end the process before exiting by itself.
const abortGrace = 10 * time.Second

// Abort is MPI_Abort, called from the caller's thread: the loop may be blocked in a
// collective that will never complete, which is usually why Abort is called. That is the one
// call that may overlap another; MPI_THREAD_SERIALIZED leaves it undefined by the standard,
// and we rely on OpenMPI's MPI_Abort, which only asks the runtime (ORTE) to kill the job and
// touches no communicator state (the frozen-rank job of make test-mpi exercises it). On a
// machine cut off from the launcher MPI_Abort waits for it forever: after abortGrace the
// process exits with code by itself, so that every rank ends within a bounded time.
func (c *Comm) Abort(code int) {
	time.AfterFunc(abortGrace, func() {
		fmt.Fprintf(os.Stderr, "mpi: MPI_Abort has not ended this process in %v (the launcher cannot be reached): exiting\n", abortGrace)
		os.Exit(code)
	})
	C.hvd_mpi_abort(C.int(code))
	select {} // MPI_Abort does not return; if it did, never let the caller carry on.
}

// Close finalizes MPI and ends the MPI thread. It waits for the calls already handed to the
// thread; a call made meanwhile or later, and a second Close, return ErrClosed.
func (c *Comm) Close() error {
	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		return ErrClosed
	}
	c.closed = true
	c.mu.Unlock()
	c.closeProbe()
	var shmErr error
	if c.shm != nil {
		shmErr = c.shm.close()
	}
	var rc C.int
	done := make(chan struct{})
	c.calls <- func() { rc = C.hvd_mpi_finalize(); close(done) }
	<-done
	close(c.calls)
	return errors.Join(shmErr, mpiError("MPI_Finalize", rc))
}
