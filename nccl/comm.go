package nccl

/*
#include "trampolines.h"
*/
import "C"

import (
	"fmt"
	"runtime"
	"unsafe"
)

// Comm is one rank's NCCL communicator on one GPU, with its own CUDA stream: collectives and
// the staging copies around them are queued on that stream in order. A Comm is not safe for
// concurrent use; gorovod's backend drives it from one goroutine.
type Comm struct {
	lib    *Library
	dev    int
	size   int
	rank   int
	comm   unsafe.Pointer
	stream *Stream
}

// NewComm joins communicator id as rank of size on stream's device (ncclCommInitRank), with
// stream for its staging copies. It blocks until all size ranks have joined, without a
// timeout. On success the Comm owns stream (Close closes it); on failure the caller does.
// The stream comes first because creating it is what sets the device's CUDA context up, the
// step most likely to fail on one rank alone (a GPU out of memory, or held by another process
// in exclusive mode): a caller creates it before its ranks agree to join.
func (l *Library) NewComm(stream *Stream, size, rank int, id UniqueID) (*Comm, error) {
	if size < 1 || rank < 0 || rank >= size {
		return nil, fmt.Errorf("nccl: NewComm: rank %d of size %d, want 0 <= rank < size", rank, size)
	}
	if err := stream.checkOpen("NewComm"); err != nil {
		return nil, err
	}
	dev := stream.Device()
	c := &Comm{lib: l, dev: dev, size: size, rank: rank, stream: stream}
	cid := (*C.gorovod_unique_id)(unsafe.Pointer(&id))
	err := l.rt.onDevice(dev, func() error {
		return l.check(C.gr_call_init_rank(l.commInitRank, &c.comm, C.int(size), cid, C.int(rank)), nil,
			"ncclCommInitRank(rank %d of %d) on device %d", rank, size, dev)
	})
	if err != nil {
		return nil, err
	}
	runtime.SetFinalizer(c, (*Comm).Close)
	return c, nil
}

// Stream is the communicator's stream, for the staging copies around its collectives.
func (c *Comm) Stream() *Stream { return c.stream }

// Device is the CUDA device the communicator runs on.
func (c *Comm) Device() int { return c.dev }

// Size is the number of ranks in the communicator.
func (c *Comm) Size() int { return c.size }

// Rank is this rank's index in the communicator.
func (c *Comm) Rank() int { return c.rank }

// span checks that count elements of dt at byte offset off fit in b, on this communicator's
// device.
func (c *Comm) span(op string, b *DeviceBuffer, off, count int, dt DataType) error {
	if c.comm == nil {
		return fmt.Errorf("nccl: %s on a closed communicator", op)
	}
	if !dt.valid() {
		return fmt.Errorf("nccl: %s: unknown data type %v", op, dt)
	}
	if b == nil || b.ptr == nil {
		return fmt.Errorf("nccl: %s: nil or closed device buffer", op)
	}
	if b.dev != c.dev {
		return fmt.Errorf("nccl: %s: buffer is on device %d, communicator on device %d", op, b.dev, c.dev)
	}
	if off < 0 || off%dt.Size() != 0 || off > b.size {
		return fmt.Errorf("nccl: %s: offset %d is not a %v element boundary within the %d-byte buffer", op, off, dt, b.size)
	}
	if count < 0 || count > (b.size-off)/dt.Size() {
		return fmt.Errorf("nccl: %s: %d %v elements (%d bytes) at offset %d do not fit in a %d-byte buffer", op, count, dt, count*dt.Size(), off, b.size)
	}
	return nil
}

// AllReduce reduces count elements of buf across all ranks with op, in place, queued on the
// communicator's stream.
func (c *Comm) AllReduce(buf *DeviceBuffer, count int, dt DataType, op RedOp) error {
	return c.AllReduceAt(buf, 0, count, dt, op)
}

// AllReduceAt is AllReduce on the count elements that start off bytes into buf (a chunk of a
// larger buffer).
func (c *Comm) AllReduceAt(buf *DeviceBuffer, off, count int, dt DataType, op RedOp) error {
	if err := c.span("AllReduce", buf, off, count, dt); err != nil {
		return err
	}
	if op < Sum || op > Avg {
		return fmt.Errorf("nccl: AllReduce: unknown reduction %v", op)
	}
	if op == Avg && c.lib.version < minVersion210 {
		return fmt.Errorf("nccl: AllReduce: average needs NCCL >= 2.10, loaded %s", c.lib.VersionString())
	}
	if dt == Bfloat16 && c.lib.version < minVersion210 {
		return fmt.Errorf("nccl: AllReduce: bfloat16 needs NCCL >= 2.10, loaded %s", c.lib.VersionString())
	}
	return c.lib.rt.onDevice(c.dev, func() error {
		p := unsafe.Add(buf.ptr, off)
		return c.lib.check(C.gr_call_coll_ii(c.lib.allReduce, p, p, C.size_t(count), C.int(dt), C.int(op), c.comm, c.stream.s),
			c.comm, "ncclAllReduce(%d %v, %v) on rank %d", count, dt, op, c.rank)
	})
}

// Broadcast copies count elements of root's buf into buf on every rank, queued on the
// communicator's stream.
func (c *Comm) Broadcast(buf *DeviceBuffer, count int, dt DataType, root int) error {
	if err := c.span("Broadcast", buf, 0, count, dt); err != nil {
		return err
	}
	if root < 0 || root >= c.size {
		return fmt.Errorf("nccl: Broadcast: root %d, want 0 <= root < size %d", root, c.size)
	}
	return c.lib.rt.onDevice(c.dev, func() error {
		return c.lib.check(C.gr_call_coll_ii(c.lib.broadcast, buf.ptr, buf.ptr, C.size_t(count), C.int(dt), C.int(root), c.comm, c.stream.s),
			c.comm, "ncclBroadcast(%d %v, root %d) on rank %d", count, dt, root, c.rank)
	})
}

// AllGather gathers count elements of send from every rank into recv, rank r's at element
// r*count, queued on the communicator's stream.
func (c *Comm) AllGather(send, recv *DeviceBuffer, count int, dt DataType) error {
	if err := c.span("AllGather send", send, 0, count, dt); err != nil {
		return err
	}
	if err := c.span("AllGather receive", recv, 0, count*c.size, dt); err != nil {
		return err
	}
	return c.lib.rt.onDevice(c.dev, func() error {
		return c.lib.check(C.gr_call_coll_i(c.lib.allGather, send.ptr, recv.ptr, C.size_t(count), C.int(dt), c.comm, c.stream.s),
			c.comm, "ncclAllGather(%d %v per rank) on rank %d", count, dt, c.rank)
	})
}

// AsyncError reports an error NCCL met in the background (a peer that died, a network
// failure): a rank waiting on a collective polls it so that it does not hang.
func (c *Comm) AsyncError() error {
	if c.comm == nil {
		return fmt.Errorf("nccl: AsyncError on a closed communicator")
	}
	var code C.int
	if err := c.lib.check(C.gr_call_p_pi(c.lib.commGetAsyncError, c.comm, &code), c.comm, "ncclCommGetAsyncError"); err != nil {
		return err
	}
	return c.lib.check(code, c.comm, "asynchronous NCCL error on rank %d", c.rank)
}

// Close destroys the communicator (ncclCommDestroy) and its stream. It is safe to call more
// than once.
func (c *Comm) Close() error {
	return c.release(c.lib.commDestroy, "ncclCommDestroy")
}

// Abort destroys the communicator without waiting for pending work (ncclCommAbort), for a
// rank that is giving up after a peer failed.
func (c *Comm) Abort() error {
	return c.release(c.lib.commAbort, "ncclCommAbort")
}

func (c *Comm) release(fn unsafe.Pointer, name string) error {
	if c.comm == nil {
		return nil
	}
	runtime.SetFinalizer(c, nil)
	err := c.lib.rt.onDevice(c.dev, func() error {
		return c.lib.check(C.gr_call_p(fn, c.comm), nil, "%s on rank %d", name, c.rank)
	})
	c.comm = nil
	if serr := c.stream.Close(); err == nil {
		err = serr
	}
	return err
}
