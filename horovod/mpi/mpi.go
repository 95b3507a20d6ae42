// Package mpi is horovod's backend over OpenMPI. MPI is initialized and finalized on one
// dedicated, locked OS thread, which makes every MPI call of the process but those of horovod's
// negotiation rounds; a round (run by horovod's background loop, or by the caller of a blocking
// operation) makes its own calls wherever Go runs it (see Serve). No two calls ever overlap, so
// MPI_THREAD_SERIALIZED is all it asks of the library, unless it is opened for horovod's process
// sets (backend.DriverConfig.ProcessSets): their Groups (group.go) make their calls on their own
// goroutines' threads, at the same time as the Comm's, which takes MPI_THREAD_MULTIPLE. float16
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
	"os"
	"runtime"
	"sync"
	"sync/atomic"
	"time"
	"unsafe"

	"github.com/gorovod/gorovod/horovod/backend"
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
// PeerProber, HostAllocator, PathReporter, OverlappedBroadcaster, ReduceScatterer, Alltoaller and
// Splitter.
type Comm struct {
	communicator
	calls chan func()
	// mu guards closed: Do holds it for reading while its call is on the MPI thread, Close for
	// writing as it marks the Comm closed, so that no call reaches the thread after Close has
	// begun, and a second Close does not finalize again.
	mu     sync.RWMutex
	closed bool
	// serving is set while Serve runs a loop: that loop is then the only
	// caller, and its calls run in place.
	serving atomic.Bool
	// threadMultiple: the thread level MPI provides lets threads make calls at once
	// (MPI_THREAD_MULTIPLE), as the Groups of Split need. Open asks for it with ProcessSets.
	threadMultiple bool
	// groups are the Groups split from this Comm and not closed yet, in the order of their
	// splits, which Close frees before it finalizes MPI (group.go). groupsMu guards it: a
	// Group's Close, on the Group's goroutine, takes it out.
	groupsMu sync.Mutex
	groups   []*Group
	// reduceScatters counts ReduceScatter's calls (ReduceScatters).
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
// small allgathers wait as cfg says. With cfg.ProcessSets it asks MPI for MPI_THREAD_MULTIPLE,
// which Split needs, and fails where the library provides less; otherwise for
// MPI_THREAD_SERIALIZED, which is all the Comm itself needs and may cost MPI less locking. It
// fails if called a second time in the same process.
func Open(cfg backend.DriverConfig) (*Comm, error) {
	first := false
	opened.Do(func() { first = true })
	if !first {
		return nil, errors.New("mpi: Open called twice: MPI can be initialized once per process")
	}
	c := &Comm{calls: make(chan func())}
	c.wait, c.do = cfg.Wait, c.Do
	ready := make(chan error)
	go c.serve(cfg.ProcessSets, ready)
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

// serve is the MPI thread: it initializes MPI (with MPI_THREAD_MULTIPLE where multiple is
// set), then runs the calls sent to it until Close.
func (c *Comm) serve(multiple bool, ready chan<- error) {
	// Never unlocked: when serve returns after MPI_Finalize, the thread exits with it.
	runtime.LockOSThread()
	var t C.hvd_topology
	ask := C.int(0)
	if multiple {
		ask = 1
	}
	if err := mpiError("MPI_Init_thread", C.hvd_mpi_init(ask, &t)); err != nil {
		ready <- err
		return
	}
	if t.thread_level < C.hvd_mpi_thread_serialized() {
		ready <- fmt.Errorf("mpi: the library provides thread level %d, below MPI_THREAD_SERIALIZED", int(t.thread_level))
		return
	}
	c.threadMultiple = t.thread_level >= C.hvd_mpi_thread_multiple()
	if multiple && !c.threadMultiple {
		ready <- fmt.Errorf("mpi: process sets (HOROVOD_DYNAMIC_PROCESS_SETS) need MPI_THREAD_MULTIPLE (%d), and the library provides thread level %d", int(C.hvd_mpi_thread_multiple()), int(t.thread_level))
		return
	}
	c.place(C.hvd_mpi_world(), &t)
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
	if err := c.checkAllreduce(send, recv, dt); err != nil {
		return err
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

// Broadcast sends root's buf over shared memory when every rank runs on this machine and buf
// is SharedBroadcastMinBytes or longer (SharedBroadcastMinBytes2 in a job of 2 ranks; see
// sharedBroadcast), otherwise with MPI in chunks of at most 2^31-1 bytes.
func (c *Comm) Broadcast(buf []byte, root int) error {
	if done, err := c.broadcastShared(buf, root); done || err != nil {
		return err
	}
	return c.mpiBroadcast(buf, root)
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
	if err := c.checkRoot(root); err != nil {
		return false, err
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

// NegotiationAllgatherv is Allgatherv for horovod's negotiation rounds (backend.Negotiator):
// MPI_Iallgatherv, tested until it completes. When every part is at most SleepingWaitMaxPart
// bytes, a rank that arrives before its peers waits for them as the Comm was opened with
// (backend.DriverConfig.Wait). Its roll call tells Reached who has entered it. The messages of
// a round are small: more than maxCount bytes in all is an error.
func (c *Comm) NegotiationAllgatherv(send, recv []byte, counts []int) error {
	sleeping, err := c.checkNegotiation(send, recv, counts)
	if err != nil || len(recv) == 0 {
		return err
	}
	sleep := C.int(0)
	if sleeping {
		sleep = 1
	}
	sp, cc := c.allgathervArgs(send, recv, counts)
	return c.call("MPI_Iallgatherv", func() C.int {
		return C.hvd_mpi_allgatherv(sp, C.int(len(send)), ptr(recv), &cc[0], &cc[len(counts)], sleep)
	})
}

// ReduceScatter is MPI_Reduce_scatter (backend.ReduceScatterer), as mpiReduceScatter makes it,
// but for a sum of at least the staging threshold when every rank runs on this machine, which
// goes over shared memory (sharedReduceScatter).
func (c *Comm) ReduceScatter(send, recv []byte, counts []int, dt backend.DType, op backend.ReduceOp) error {
	// Every rank passes the same counts, so every rank leaves an empty tensor alike.
	if err := c.checkReduceScatter(send, recv, counts, dt, op); err != nil || len(send) == 0 {
		return err
	}
	c.reduceScatters.Add(1)
	c.lastReduceScatterPath = ""
	if c.shm != nil && op == backend.Sum && len(send) >= c.shm.stagedMin && len(send)/dt.Size() <= maxCount {
		done, err := c.sharedReduceScatter(send, recv, c.blockAt(counts), dt)
		if done {
			c.lastReduceScatterPath = "SHM"
		}
		if done || err != nil {
			return err
		}
	}
	// Past maxCount elements, the whole Allreduce: over shared memory where it goes there.
	return c.mpiReduceScatter(send, recv, counts, dt, op, c.Allreduce)
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
// thread; a call made meanwhile or later, and a second Close, return ErrClosed. A Group split
// from the Comm and still open is freed first, on the MPI thread (see freeGroups), after the
// call it may be making: from then on its calls, and its Close, return ErrClosed.
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
	var groupsErr error
	var rc C.int
	done := make(chan struct{})
	c.calls <- func() {
		groupsErr = c.freeGroups()
		rc = C.hvd_mpi_finalize()
		close(done)
	}
	<-done
	close(c.calls)
	return errors.Join(shmErr, groupsErr, mpiError("MPI_Finalize", rc))
}
