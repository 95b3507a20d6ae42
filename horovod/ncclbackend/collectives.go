package ncclbackend

import (
	"errors"
	"fmt"
	"runtime"
	"time"

	"github.com/gorovod/gorovod/horovod/backend"
	"github.com/gorovod/gorovod/horovod/internal/parallel"
	"github.com/gorovod/gorovod/nccl"
)

// hostBuffer is one side of a collective in pinned memory: the caller's buffer itself when it
// lies in memory the backend lent (AllocHost), else the staging buffer, which the data is copied
// into or out of.
type hostBuffer struct {
	p    *nccl.PinnedBuffer
	off  int
	lent bool
}

// hostBuffers finds bufs in lent memory (none when stageAll is set), makes sure the staging
// buffer holds the longest of those that are not (an empty one needs no memory), and *dev
// devBytes, and returns where each buffer's data is to be DMAed from or to.
func (b *Backend) hostBuffers(stageAll bool, dev **nccl.DeviceBuffer, devBytes int, bufs ...[]byte) ([]hostBuffer, error) {
	sides := make([]hostBuffer, len(bufs))
	staged := 0
	for i, buf := range bufs {
		if !stageAll {
			p, off, ok := b.lent.find(buf)
			sides[i] = hostBuffer{p, off, ok}
		}
		if !sides[i].lent {
			staged = max(staged, len(buf))
		}
	}
	if err := b.stage(staged, dev, devBytes); err != nil {
		return nil, err
	}
	for i := range sides {
		if !sides[i].lent {
			sides[i].p = b.pinned
		}
	}
	return sides, nil
}

// Allreduce stages send to the device chunk by chunk, reduces each chunk in place as soon as
// it is there (an elementwise reduction of the chunks is the reduction of the whole), stages
// the result back and copies it to recv. A side in lent memory is DMAed where it is instead:
// an in-place allreduce on it makes no host copy at all. send and recv that partly overlap
// (backend.Backend forbids it; horovod never passes them) are both staged, so that all of send
// is read before recv is written: DMAing in place, a chunk's result would land on send's
// later chunks before they are read.
func (b *Backend) Allreduce(send, recv []byte, dt backend.DType, op backend.ReduceOp) error {
	t, err := ncclType(dt)
	if err != nil {
		return err
	}
	o, err := ncclOp(op)
	if err != nil {
		return err
	}
	n := len(send)
	if len(recv) != n || n%dt.Size() != 0 {
		return fmt.Errorf("ncclbackend: allreduce of %d bytes into %d bytes of %v", n, len(recv), dt)
	}
	if n == 0 {
		return nil
	}
	partly := parallel.Overlap(send, recv) && !parallel.Same(send, recv)
	sides, err := b.hostBuffers(partly, &b.dev, n, send, recv)
	if err != nil {
		return b.fail("allreduce", err)
	}
	from, to := sides[0], sides[1]
	s := b.comm.Stream()
	for off := 0; off < n; off += chunkBytes {
		m := min(chunkBytes, n-off)
		if !from.lent { // overlaps the DMA and reduction of earlier chunks
			parallel.Copy(from.p.Bytes()[off:off+m], send[off:off+m], b.copyWorkers)
		}
		if err := s.CopyToDevice(b.dev, off, from.p, from.off+off, m); err != nil {
			return b.abandon("allreduce", err)
		}
		if err := b.comm.AllReduceAt(b.dev, off, m/dt.Size(), t, o); err != nil {
			return b.abandon("allreduce", err)
		}
		if err := s.CopyToHost(to.p, to.off+off, b.dev, off, m); err != nil {
			return b.abandon("allreduce", err)
		}
	}
	if err := b.wait(); err != nil {
		return b.abort("allreduce", err)
	}
	if !to.lent {
		parallel.Copy(recv, to.p.Bytes()[:n], b.copyWorkers)
	}
	return nil
}

// Broadcast stages root's buf to the device (only root needs to), broadcasts it and stages it
// back on the other ranks; a buf in lent memory is DMAed where it is.
func (b *Backend) Broadcast(buf []byte, root int) error {
	if root < 0 || root >= b.topo.Size {
		return fmt.Errorf("ncclbackend: broadcast root %d in a job of size %d", root, b.topo.Size)
	}
	n := len(buf)
	if n == 0 {
		return nil
	}
	sides, err := b.hostBuffers(false, &b.dev, n, buf)
	if err != nil {
		return b.fail("broadcast", err)
	}
	h := sides[0]
	s := b.comm.Stream()
	if b.topo.Rank == root {
		if !h.lent {
			parallel.Copy(h.p.Bytes(), buf, b.copyWorkers)
		}
		if err := s.CopyToDevice(b.dev, 0, h.p, h.off, n); err != nil {
			return b.abandon("broadcast", err)
		}
	}
	if err := b.comm.Broadcast(b.dev, n, nccl.Uint8, root); err != nil {
		return b.abandon("broadcast", err)
	}
	if b.topo.Rank != root {
		if err := s.CopyToHost(h.p, h.off, b.dev, 0, n); err != nil {
			return b.abandon("broadcast", err)
		}
	}
	if err := b.wait(); err != nil {
		return b.abort("broadcast", err)
	}
	if b.topo.Rank == root {
		return nil
	}
	if !h.lent {
		parallel.Copy(buf, h.p.Bytes()[:n], b.copyWorkers)
	}
	return nil
}

// Allgatherv pads every rank's part to the largest count (NCCL has no allgatherv), gathers
// with ncclAllGather and drops the padding on the way back to the host: the copy of rank r's
// part lands directly at its offset in recv (or in the staging buffer). send and recv in lent
// memory are DMAed where they are (send is on the device before any copy back is queued, so
// they may even overlap).
func (b *Backend) Allgatherv(send, recv []byte, counts []int) error {
	if len(counts) != b.topo.Size || counts[b.topo.Rank] != len(send) {
		return fmt.Errorf("ncclbackend: allgatherv: counts %v for rank %d of %d sending %d bytes", counts, b.topo.Rank, b.topo.Size, len(send))
	}
	most, total := 0, 0
	for _, c := range counts {
		if c < 0 {
			return fmt.Errorf("ncclbackend: allgatherv: negative count in %v", counts)
		}
		most, total = max(most, c), total+c
	}
	if total != len(recv) {
		return fmt.Errorf("ncclbackend: allgatherv: counts %v sum to %d, receive buffer has %d bytes", counts, total, len(recv))
	}
	if most == 0 {
		return nil
	}
	sides, err := b.hostBuffers(false, &b.dev, most, send, recv) // most >= len(send)
	if err != nil {
		return b.fail("allgatherv", err)
	}
	from, to := sides[0], sides[1]
	if err := b.stage(0, &b.gather, most*b.topo.Size); err != nil {
		return b.fail("allgatherv", err)
	}
	s := b.comm.Stream()
	if len(send) > 0 {
		if !from.lent {
			parallel.Copy(from.p.Bytes(), send, b.copyWorkers)
		}
		if err := s.CopyToDevice(b.dev, 0, from.p, from.off, len(send)); err != nil {
			return b.abandon("allgatherv", err)
		}
	}
	if err := b.comm.AllGather(b.dev, b.gather, most, nccl.Uint8); err != nil {
		return b.abandon("allgatherv", err)
	}
	// The copies back are queued after the gather on the same stream, so they overwrite staged
	// send data only once it is on the device.
	off := 0
	for r, c := range counts {
		if c > 0 {
			if err := s.CopyToHost(to.p, to.off+off, b.gather, r*most, c); err != nil {
				return b.abandon("allgatherv", err)
			}
		}
		off += c
	}
	if err := b.wait(); err != nil {
		return b.abort("allgatherv", err)
	}
	if !to.lent {
		parallel.Copy(recv, to.p.Bytes()[:total], b.copyWorkers)
	}
	return nil
}

// Barrier is a one-element allreduce, waited for.
func (b *Backend) Barrier() error {
	if err := b.stage(0, &b.dev, 4); err != nil {
		return b.fail("barrier", err)
	}
	if err := b.comm.AllReduce(b.dev, 1, nccl.Int32, nccl.Sum); err != nil {
		return b.fail("barrier", err)
	}
	if err := b.wait(); err != nil {
		return b.abort("barrier", err)
	}
	return nil
}

// wait waits for the stream, polling NCCL for asynchronous errors meanwhile: a blocking
// cudaStreamSynchronize would wait forever for a peer that died, while ncclCommGetAsyncError
// reports it.
func (b *Backend) wait() error {
	s := b.comm.Stream()
	for spin := 0; ; spin++ {
		done, err := s.Done()
		if done || err != nil {
			return err
		}
		if err := b.comm.AsyncError(); err != nil {
			return err
		}
		if spin < 64 {
			runtime.Gosched()
		} else {
			time.Sleep(50 * time.Microsecond)
		}
	}
}

// abandon is fail for a collective that has queued work on the stream: before it returns, that
// work is over, since its copies read and write the caller's buffers, which may be memory the
// backend lent (horovod frees such memory once a step is over, and the next collective would
// reuse the staging buffers). The stream is waited for as wait does, without hanging on a dead
// peer; when it cannot finish (an asynchronous NCCL error), the communicator is aborted, which
// ends its kernels, and the backend is broken from then on (as backend.Backend allows after an
// error): cudaFreeHost, which frees lent memory, waits for what is left on the device.
func (b *Backend) abandon(what string, err error) error {
	if werr := b.wait(); werr != nil {
		return b.abort(what, errors.Join(err, werr))
	}
	return b.fail(what, err)
}

// abort is fail for a collective whose queued work cannot finish (wait failed): it aborts the
// communicator, as abandon does.
func (b *Backend) abort(what string, err error) error {
	return b.fail(what, errors.Join(err, b.comm.Abort()))
}

// fail names the collective in err; nil stays nil.
func (b *Backend) fail(what string, err error) error {
	if err == nil {
		return nil
	}
	return fmt.Errorf("ncclbackend: %s on rank %d: %w", what, b.topo.Rank, err)
}

// Abort tears the communicator down without waiting for peers, then ends the job through the
// control backend (MPI_Abort), which can reach the other processes.
func (b *Backend) Abort(code int) {
	b.comm.Abort()
	b.control.Abort(code)
}

// Close destroys the communicator and frees the staging buffers and the memory it lent. The
// control backend is horovod's to close.
func (b *Backend) Close() error {
	var errs []error
	errs = append(errs, b.comm.Close(), b.lent.close())
	for _, d := range []*nccl.DeviceBuffer{b.dev, b.gather} {
		if d != nil {
			errs = append(errs, d.Close())
		}
	}
	if b.pinned != nil {
		errs = append(errs, b.pinned.Close())
	}
	return errors.Join(errs...)
}
