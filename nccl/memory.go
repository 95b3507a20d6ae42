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

// DeviceBuffer is memory on one GPU (cudaMalloc). Close frees it; a finalizer frees it if
// Close was never called.
type DeviceBuffer struct {
	rt   *Runtime
	dev  int
	ptr  unsafe.Pointer
	size int
}

// AllocDevice allocates size bytes on device dev.
func (rt *Runtime) AllocDevice(dev, size int) (*DeviceBuffer, error) {
	if size <= 0 {
		return nil, fmt.Errorf("nccl: AllocDevice: size %d bytes, want > 0", size)
	}
	b := &DeviceBuffer{rt: rt, dev: dev, size: size}
	err := rt.onDevice(dev, func() error {
		return rt.check(C.gr_call_pp_z(rt.malloc, &b.ptr, C.size_t(size)), "cudaMalloc(%d bytes) on device %d", size, dev)
	})
	if err != nil {
		return nil, err
	}
	runtime.SetFinalizer(b, (*DeviceBuffer).Close)
	return b, nil
}

// Size is the buffer's size in bytes.
func (b *DeviceBuffer) Size() int { return b.size }

// Device is the GPU the buffer lives on.
func (b *DeviceBuffer) Device() int { return b.dev }

// Close frees the memory. It is safe to call more than once.
func (b *DeviceBuffer) Close() error {
	if b.ptr == nil {
		return nil
	}
	runtime.SetFinalizer(b, nil)
	err := b.rt.onDevice(b.dev, func() error {
		return b.rt.check(C.gr_call_p(b.rt.free, b.ptr), "cudaFree on device %d", b.dev)
	})
	b.ptr = nil
	return err
}

// PinnedBuffer is page-locked host memory (cudaHostAlloc, portable): the GPU copies to and
// from it by DMA, asynchronously and at full PCIe bandwidth, which pageable Go memory cannot
// give. Bytes exposes it to Go. Close frees it; a finalizer frees it if Close was never called.
type PinnedBuffer struct {
	rt   *Runtime
	dev  int
	ptr  unsafe.Pointer
	size int
}

// AllocPinned allocates size bytes of pinned host memory. dev is the device whose context is
// current for the allocation: each rank passes its own, so no rank creates a context on
// another rank's GPU.
func (rt *Runtime) AllocPinned(dev, size int) (*PinnedBuffer, error) {
	if size <= 0 {
		return nil, fmt.Errorf("nccl: AllocPinned: size %d bytes, want > 0", size)
	}
	b := &PinnedBuffer{rt: rt, dev: dev, size: size}
	err := rt.onDevice(dev, func() error {
		return rt.check(C.gr_call_pp_z_u(rt.hostAlloc, &b.ptr, C.size_t(size), cudaHostAllocPortable),
			"cudaHostAlloc(%d bytes, portable) with device %d current", size, dev)
	})
	if err != nil {
		return nil, err
	}
	runtime.SetFinalizer(b, (*PinnedBuffer).Close)
	return b, nil
}

// Size is the buffer's size in bytes.
func (b *PinnedBuffer) Size() int { return b.size }

// Bytes is the pinned memory as a Go slice, valid until Close. Go must not touch it while a
// copy on a stream that reads or writes it is in flight (until Stream.Synchronize).
func (b *PinnedBuffer) Bytes() []byte {
	if b.ptr == nil {
		return nil
	}
	return unsafe.Slice((*byte)(b.ptr), b.size)
}

// Close frees the memory. It is safe to call more than once.
func (b *PinnedBuffer) Close() error {
	if b.ptr == nil {
		return nil
	}
	runtime.SetFinalizer(b, nil)
	err := b.rt.onDevice(b.dev, func() error {
		return b.rt.check(C.gr_call_p(b.rt.freeHost, b.ptr), "cudaFreeHost")
	})
	b.ptr = nil
	return err
}

// Stream is a CUDA stream on one device (non-blocking with respect to the legacy default
// stream). Work queued on it runs in order; Synchronize waits for all of it.
type Stream struct {
	rt  *Runtime
	dev int
	s   unsafe.Pointer
}

// NewStream creates a stream on device dev.
func (rt *Runtime) NewStream(dev int) (*Stream, error) {
	s := &Stream{rt: rt, dev: dev}
	err := rt.onDevice(dev, func() error {
		return rt.check(C.gr_call_pp_u(rt.streamCreateWithFlags, &s.s, cudaStreamNonBlocking),
			"cudaStreamCreateWithFlags on device %d", dev)
	})
	if err != nil {
		return nil, err
	}
	runtime.SetFinalizer(s, (*Stream).Close)
	return s, nil
}

// Device is the stream's GPU.
func (s *Stream) Device() int { return s.dev }

func (s *Stream) checkOpen(op string) error {
	if s.s == nil {
		return fmt.Errorf("nccl: %s on a closed stream", op)
	}
	return nil
}

// copySpan checks one side of a copy: n bytes at off within a buffer of size bytes.
func copySpan(what string, off, n, size int) error {
	if off < 0 || n < 0 || off > size || n > size-off {
		return fmt.Errorf("nccl: %s: %d bytes at offset %d do not fit in %d bytes", what, n, off, size)
	}
	return nil
}

// CopyToDevice queues a copy of n bytes from src[srcOff:] to dst[dstOff:].
func (s *Stream) CopyToDevice(dst *DeviceBuffer, dstOff int, src *PinnedBuffer, srcOff, n int) error {
	if err := s.checkCopy("CopyToDevice", dst, dstOff, src, srcOff, n); err != nil {
		return err
	}
	return s.rt.onDevice(s.dev, func() error {
		return s.rt.check(C.gr_call_memcpy(s.rt.memcpyAsync, unsafe.Add(dst.ptr, dstOff), unsafe.Add(src.ptr, srcOff),
			C.size_t(n), cudaMemcpyHostToDevice, s.s), "cudaMemcpyAsync(%d bytes, host to device %d)", n, s.dev)
	})
}

// CopyToHost queues a copy of n bytes from src[srcOff:] to dst[dstOff:].
func (s *Stream) CopyToHost(dst *PinnedBuffer, dstOff int, src *DeviceBuffer, srcOff, n int) error {
	if err := s.checkCopy("CopyToHost", src, srcOff, dst, dstOff, n); err != nil {
		return err
	}
	return s.rt.onDevice(s.dev, func() error {
		return s.rt.check(C.gr_call_memcpy(s.rt.memcpyAsync, unsafe.Add(dst.ptr, dstOff), unsafe.Add(src.ptr, srcOff),
			C.size_t(n), cudaMemcpyDeviceToHost, s.s), "cudaMemcpyAsync(%d bytes, device %d to host)", n, s.dev)
	})
}

func (s *Stream) checkCopy(op string, d *DeviceBuffer, dOff int, h *PinnedBuffer, hOff, n int) error {
	if err := s.checkOpen(op); err != nil {
		return err
	}
	if d.ptr == nil || h.ptr == nil {
		return fmt.Errorf("nccl: %s: buffer already closed", op)
	}
	if d.dev != s.dev {
		return fmt.Errorf("nccl: %s: device buffer is on device %d, stream on device %d", op, d.dev, s.dev)
	}
	if err := copySpan(op+" device side", dOff, n, d.size); err != nil {
		return err
	}
	return copySpan(op+" host side", hOff, n, h.size)
}

// Synchronize waits until all work queued on the stream has finished.
func (s *Stream) Synchronize() error {
	if err := s.checkOpen("Synchronize"); err != nil {
		return err
	}
	return s.rt.onDevice(s.dev, func() error {
		return s.rt.check(C.gr_call_p(s.rt.streamSynchronize, s.s), "cudaStreamSynchronize on device %d", s.dev)
	})
}

// Done reports whether all work queued on the stream has finished, without blocking
// (cudaStreamQuery). A caller that must not hang on a dead peer polls Done and the
// communicator's AsyncError instead of calling Synchronize.
func (s *Stream) Done() (bool, error) {
	if err := s.checkOpen("Done"); err != nil {
		return false, err
	}
	done := false
	err := s.rt.onDevice(s.dev, func() error {
		code := C.gr_call_p(s.rt.streamQuery, s.s)
		if code == cudaErrorNotReady {
			return nil
		}
		done = code == cudaSuccess
		return s.rt.check(code, "cudaStreamQuery on device %d", s.dev)
	})
	return done, err
}

// Close destroys the stream. It is safe to call more than once.
func (s *Stream) Close() error {
	if s.s == nil {
		return nil
	}
	runtime.SetFinalizer(s, nil)
	err := s.rt.onDevice(s.dev, func() error {
		return s.rt.check(C.gr_call_p(s.rt.streamDestroy, s.s), "cudaStreamDestroy on device %d", s.dev)
	})
	s.s = nil
	return err
}
