// Package backend is the small interface between package horovod and a collective-communication
// engine, in the spirit of database/sql/driver: horovod owns the semantics (negotiation, fusion,
// scaling, averaging, compression, the timeline, the stall inspector) and a Backend owns only the
// wire. Implementations: horovod/mpi (OpenMPI), horovod/local (one process), and an adapter over
// package nccl for GPUs.
//
// A Backend is driven by exactly one goroutine at a time: package horovod calls it only from the
// goroutine running a negotiation round (its background loop, or the caller of a blocking
// operation running the round itself), never from two at once, and every rank calls the same
// collectives in the same order with matching arguments (negotiation guarantees that before any
// data collective is issued). Implementations therefore need no locking of their own and may
// assume matching calls on every rank. A process set's backend (Splitter) is a Backend of its
// own, driven so by its own goroutine, at the same time as the one it was split from.
//
// All buffers are host memory. A GPU backend stages them to and from the device itself.
package backend

import (
	"errors"
	"fmt"
	"time"
)

// DType is the element type of a buffer. The zero value is invalid so that a forgotten dtype is an
// error rather than a silent uint8.
type DType uint8

// The element types that cross the wire. Float16 is IEEE 754 binary16 and BFloat16 is bfloat16
// (float32's top 16 bits), each stored as its bit pattern.
const (
	Uint8 DType = iota + 1
	Int8
	Int32
	Int64
	Float16
	Float32
	Float64
	BFloat16
)

// DTypes lists every valid DType, in declaration order.
var DTypes = []DType{Uint8, Int8, Int32, Int64, Float16, Float32, Float64, BFloat16}

// Size is the number of bytes of one element; 0 for an invalid DType.
func (d DType) Size() int {
	switch d {
	case Uint8, Int8:
		return 1
	case Float16, BFloat16:
		return 2
	case Int32, Float32:
		return 4
	case Int64, Float64:
		return 8
	}
	return 0
}

// IsFloat reports whether d is a floating-point type.
func (d DType) IsFloat() bool { return d == Float16 || d == Float32 || d == Float64 || d == BFloat16 }

// Valid reports whether d is one of the declared types.
func (d DType) Valid() bool { return d.Size() != 0 }

func (d DType) String() string {
	switch d {
	case Uint8:
		return "uint8"
	case Int8:
		return "int8"
	case Int32:
		return "int32"
	case Int64:
		return "int64"
	case Float16:
		return "float16"
	case Float32:
		return "float32"
	case Float64:
		return "float64"
	case BFloat16:
		return "bfloat16"
	}
	return fmt.Sprintf("DType(%d)", uint8(d))
}

// ReduceOp is the elementwise reduction a Backend performs. Averaging is not a backend concern:
// horovod implements it as Sum followed by a postscale of 1/size, as Horovod does.
type ReduceOp uint8

// The reductions every Backend supports for every DType, Float16 and BFloat16 included.
const (
	Sum ReduceOp = iota + 1
	Min
	Max
	Product
)

func (o ReduceOp) String() string {
	switch o {
	case Sum:
		return "sum"
	case Min:
		return "min"
	case Max:
		return "max"
	case Product:
		return "product"
	}
	return fmt.Sprintf("ReduceOp(%d)", uint8(o))
}

// Topology says where this process sits in the job, with Horovod's meanings: Rank and Size over
// the whole job; LocalRank and LocalSize among the processes on this machine; CrossRank and
// CrossSize among the processes with the same LocalRank on all machines (CrossRank is the index of
// this machine when every machine runs the same number of processes).
type Topology struct {
	Rank, Size           int
	LocalRank, LocalSize int
	CrossRank, CrossSize int
}

// Backend carries collectives over a fixed group of processes. Every method is a collective: all
// ranks call it, in the same order, with buffers of equal length (Allgatherv: with equal counts).
// A method returns only when its part of the collective is complete and the buffers may be reused.
// Errors are returned, never panicked; after an error the Backend should be considered broken.
type Backend interface {
	// Name identifies the engine in messages and the timeline ("mpi", "local", "nccl").
	Name() string

	// Topology is fixed for the life of the Backend.
	Topology() Topology

	// Allreduce reduces send elementwise over all ranks with op and writes the result to recv.
	// len(send) == len(recv), a multiple of dt.Size(). send and recv may be the same slice (an
	// in-place reduction); otherwise they must not overlap.
	Allreduce(send, recv []byte, dt DType, op ReduceOp) error

	// Broadcast copies root's buf into buf on every other rank. It only reads root's buf.
	Broadcast(buf []byte, root int) error

	// Allgatherv concatenates every rank's send into recv in rank order. counts[r] is the number of
	// bytes rank r sends (so counts[Rank] == len(send)); len(recv) == sum(counts). Every rank passes
	// the same counts.
	Allgatherv(send, recv []byte, counts []int) error

	// Barrier returns once every rank has entered it.
	Barrier() error

	// Abort terminates every process of the job with the given exit code, without waiting for the
	// other ranks to cooperate. horovod calls it when the stall inspector gives up, so that no rank is
	// left blocked in a collective. It does not return.
	Abort(code int)

	// Close releases the engine. It is called once, after the last collective, on every rank.
	Close() error
}

// Opener opens a data Backend on top of the control Backend that horovod negotiates with. A GPU
// backend uses control to agree on its communicator (for NCCL: rank 0's ncclUniqueId travels by
// control.Broadcast) and to choose its device (control.Topology().LocalRank). It runs before
// horovod's background loop starts, so it may call control's collectives freely, as long as every
// rank makes the same ones whether or not its own part fails (agree before diverging, as the NCCL
// adapter does). It may then fail on some ranks only: horovod agrees on every rank's outcome
// afterwards and fails Init on all of them.
type Opener func(control Backend) (Backend, error)

// OverlappedBroadcaster is implemented by a Backend that can leave a broadcast in flight while
// the caller works: horovod's root copies its input into the result of a Broadcast while the
// broadcast sends from the input, on the same thread, instead of copying first (MPI: 64 MiB, 2
// ranks, 21 ms copying first, 12 ms overlapped, on 2 cores where a copy on a thread of its own
// competes with the rank's own wait).
type OverlappedBroadcaster interface {
	Backend
	// BroadcastWhile is Broadcast, calling during on the calling goroutine while the broadcast is
	// in flight on this rank; it returns once both are done. during only reads buf.
	BroadcastWhile(buf []byte, root int, during func()) error
}

// ThreadBound is implemented by a Backend whose calls are otherwise handed over to a thread of
// its own, as MPI's are to the thread that initialized it. horovod runs its background loop
// through Serve, so that the calls of its negotiation rounds are made directly instead of being
// handed over one by one. (It has nothing to do with pinned, page-locked memory: see
// HostAllocator.)
type ThreadBound interface {
	Backend
	// Serve runs loop and returns when loop returns; meanwhile the backend's methods run in
	// place, on the caller's thread. While loop runs, the backend is called only by the
	// goroutine running a negotiation round (loop's, or a blocking operation's caller), one at a
	// time (Abort excepted).
	Serve(loop func())
}

// RollCall is implemented by a Backend that can tell, while a collective is blocked, which ranks
// have entered it: horovod's watchdog asks when one stalls, so that its warning names the ranks
// that are late (stopped, hung or dead) instead of guessing. Unlike the collectives, Reached may
// be called from any goroutine, concurrently with the collective it describes.
type RollCall interface {
	Backend
	// Reached describes the collective in progress: the ranks this rank knows to have entered it
	// (itself included) and those it cannot tell about; every other rank has not entered it. ok
	// is false when no collective is in progress or the one in progress keeps no roll call.
	Reached() (reached, unknown []int, ok bool)
}

// Negotiator is implemented by a Backend with an allgather of its own for horovod's negotiation
// rounds, which differ from the data's: their messages are small, a rank often reaches one long
// before its peers (they are still computing), and the watchdog wants to know who has entered one
// that stalls (RollCall). A wait fit for them (MPI: a nonblocking allgather, tested with sleeps
// in between, keeping a roll call) slows down a data allgather, which every rank enters once
// negotiation has agreed on it (MPI, 2 ranks: 1.5x the blocking allgather's time at 1 MiB per rank).
// horovod's control exchanges (its negotiation rounds, and the agreements of Init and of a data
// backend's Opener on which ranks could set up) go through NegotiationAllgatherv when the control
// Backend has it (ControlAllgatherv), through Allgatherv otherwise; its contract is Allgatherv's.
type Negotiator interface {
	Backend
	NegotiationAllgatherv(send, recv []byte, counts []int) error
}

// ControlAllgatherv is b's allgather for a control exchange: NegotiationAllgatherv where b is a
// Negotiator, Allgatherv otherwise.
func ControlAllgatherv(b Backend, send, recv []byte, counts []int) error {
	if n, ok := b.(Negotiator); ok {
		return n.NegotiationAllgatherv(send, recv, counts)
	}
	return b.Allgatherv(send, recv, counts)
}

// PeerProber is implemented by a Backend that can try to reach its peers over the network
// without its collectives, which block when a peer cannot be reached: horovod's watchdog asks
// when a collective stalls, so that its message names the machines that do not answer (a link
// down for good) or says that this machine is the one cut off. Like Reached, ProbePeers may be
// called from any goroutine, concurrently with the collective that stalled.
type PeerProber interface {
	Backend
	// ProbePeers tries every other rank within about timeout and says what it found, in a
	// phrase for the stall message.
	ProbePeers(timeout time.Duration) string
}

// ErrNotLending is what AllocHost returns (wrapped) when the backend has no memory of its own
// to lend in this job, which is no failure: horovod uses Go memory without a word (MPI lends
// shared memory only when the whole job runs on one machine).
var ErrNotLending = errors.New("no host memory of the backend's own to lend")

// HostAllocator is implemented by a data Backend whose collectives move host memory of its own
// faster than other host memory: for NCCL, page-locked ("pinned") memory the GPU reads and
// writes by DMA, where a buffer in Go memory costs two extra host copies per collective (into
// and out of the backend's staging buffer); for MPI, with every rank on one machine, memory the
// other ranks map too, so that an allreduce reads and writes every rank's buffer directly. horovod puts the buffers it reuses from step to step
// there (a Reducer's result and float16 wire arenas), as Horovod's GPU operations keep their
// fusion buffer on the device to avoid the same copies. Collectives accept such memory and
// ordinary memory alike, and any sub-slice of an allocation: where they read or write it
// directly is the backend's business, never a change in results.
//
// It is an interface of its own, not a Backend method, because some backends (local) have no
// faster memory to offer; horovod asks for it with a type assertion, as
// database/sql does for optional driver interfaces.
//
// Unlike the collectives, its methods may be called from any goroutine, concurrently with a
// collective in progress (one on other memory: memory must not be freed while a collective uses
// it).
type HostAllocator interface {
	Backend
	// AllocHost returns n > 0 bytes of the backend's host memory, zeroed or not. The memory is
	// the backend's: valid until FreeHost or Close, whichever comes first, and never moved. When
	// it fails (out of pinned memory), horovod uses Go memory instead, and says so once, unless
	// the error is ErrNotLending.
	AllocHost(n int) ([]byte, error)
	// FreeHost gives back memory AllocHost returned: the whole slice it returned (a part of it
	// is an error, not the whole freed). After Close it does nothing: Close frees every
	// allocation.
	FreeHost(buf []byte) error
}

// PathReporter is implemented by a Backend whose Allreduce, Broadcast, Allgatherv and ReduceScatter move some
// buffers another way than their usual one (MPI: over shared memory, see HostAllocator). horovod
// asks right after each of them, from the goroutine that made it, and names the timeline's wire
// phase after the answer, so that a run shows which way its tensors went.
type PathReporter interface {
	Backend
	// AllreducePath names the way the last Allreduce went, in capitals ("SHM"); "" for the
	// backend's usual way, which the timeline calls by the backend's Name.
	AllreducePath() string
	// BroadcastPath is AllreducePath for the last Broadcast (or BroadcastWhile).
	BroadcastPath() string
	// AllgatherPath is AllreducePath for the last Allgatherv.
	AllgatherPath() string
	// ReduceScatterPath is AllreducePath for the last ReduceScatter (of a ReduceScatterer).
	ReduceScatterPath() string
}

// ReduceScatterer is implemented by a Backend with a reduce-scatter of its own (MPI's
// MPI_Reduce_scatter): each rank receives only its block of the reduction, so no rank holds the
// whole result. horovod's Reducescatter uses it where the data backend has it, and otherwise
// reduces the whole tensor with Allreduce and keeps this rank's block (the same result, with a
// result buffer of the whole tensor's size).
type ReduceScatterer interface {
	Backend
	// ReduceScatter reduces send elementwise over all ranks with op and writes rank r's block of
	// the result, counts[r] bytes starting at the sum of the counts before it, to recv on rank r.
	// len(send) == sum(counts), every count a multiple of dt.Size(), len(recv) == counts[Rank],
	// and send and recv do not overlap. Every rank passes the same counts.
	ReduceScatter(send, recv []byte, counts []int, dt DType, op ReduceOp) error
}

// Alltoaller is implemented by a Backend with an all-to-all exchange of its own (MPI's
// MPI_Alltoallv). horovod's Alltoall uses it where the data backend has it, and otherwise
// gathers every rank's whole input with Allgatherv and keeps the blocks addressed to this rank
// (the same result, moving every block to every rank).
type Alltoaller interface {
	Backend
	// Alltoallv sends sendCounts[r] bytes of send to rank r, the blocks in rank order, and
	// receives recvCounts[r] bytes from rank r into recv, in rank order. len(send) ==
	// sum(sendCounts), len(recv) == sum(recvCounts), recvCounts[r] on this rank equals
	// sendCounts[Rank] on rank r, and send and recv do not overlap.
	Alltoallv(send []byte, sendCounts []int, recv []byte, recvCounts []int) error
}

// Splitter is implemented by a Backend that can make a backend over some of its ranks, for
// horovod's process sets (Horovod's hvd.add_process_set): each set negotiates and moves its
// tensors among its own ranks, on a backend of its own, while the job's backend goes on.
type Splitter interface {
	Backend
	// Split is a collective of every rank of this backend, made on every rank in the same order
	// as its other collectives, with the same ranks: ascending, distinct, each in [0, Size). On a
	// rank in ranks it returns a Backend over those ranks alone, whose rank i is ranks[i] here
	// (its Topology says this process's place in the set); on the others it returns nil. The new
	// Backend is driven by a goroutine of its own, concurrently with this one and with its other
	// splits (each of them still by one goroutine at a time), which a backend opened without
	// DriverConfig.ProcessSets may not allow: Split then fails on every rank alike, before any
	// collective, with an error wrapping ErrCannotSplit that names the setting, and the backend
	// goes on. A split is closed before the backend it was split from.
	Split(ranks []int) (Backend, error)
}

// ErrCannotSplit is what Split returns (wrapped) where the backend cannot be split in this job,
// on every rank, before any collective: no failure of the backend itself.
var ErrCannotSplit = errors.New("cannot split into process sets")
