package tf

/*
#include <stdint.h>
#include <tensorflow/c/tf_tensor.h>

TF_Tensor* gorovod_new_view(TF_DataType dtype, const int64_t* dims, int num_dims, void* data, size_t len, uintptr_t pin);
*/
import "C"

import (
	"fmt"
	"runtime"
	"runtime/cgo"
	"sync/atomic"
	"unsafe"
)

// TensorAlignment is the byte alignment TensorFlow's kernels assume of a tensor's data
// (EIGEN_MAX_ALIGN_BYTES of the CPU wheels): NewTensorOver takes memory aligned to it.
const TensorAlignment = 64

// NewTensorOver returns a tensor whose data is values' memory itself, not a copy: feeding it
// costs no pass over the values, which for a training step's gradients (90 MB for MiniLM) is a
// copy of all of them saved every step. values must start at a TensorAlignment boundary (the
// start of a large Go allocation, or of page-aligned C memory, and every offset from there that
// is a multiple of it), else TensorFlow would copy them anyway: that is an error here, so that a
// caller that wants the copy makes it knowingly.
//
// TensorFlow never writes into the memory: a buffer it does not own is never forwarded to an
// op's output (TensorBuffer::OwnsMemory). The caller must not write it while a Run that feeds
// the tensor is in progress; between runs, writes to values are what the next run reads.
//
// Go memory is pinned (runtime.Pinner) for as long as TensorFlow refers to it: until Close, or
// later when an output of a run still shares the buffer (an Identity of the feed) until that
// output is closed too. C memory, such as pinned host memory a collective backend lends, must
// stay valid that long: its owner cannot know, so close the tensor, and any output of a run that
// may alias it, before freeing the memory. Overwrite on such a tensor gives it a buffer of its
// own (TensorFlow reports the memory as shared), after which it no longer refers to values.
func NewTensorOver[T Scalar](values []T, shape ...int64) (*Tensor, error) {
	dtype := dtypeOf[T]()
	if err := checkShape(shape, len(values), dtype.byteSize()); err != nil {
		return nil, err
	}
	if len(values) == 0 { // no memory to refer to: an empty tensor of TensorFlow's own
		return adopt(allocate(dtype, shape, 0)), nil
	}
	p := unsafe.Pointer(unsafe.SliceData(values))
	if uintptr(p)%TensorAlignment != 0 {
		return nil, fmt.Errorf("tf: %s%s over memory at %p, which is not %d-byte aligned (TensorFlow would copy it)",
			dtype, shapeString(shape), p, TensorAlignment)
	}
	pin := new(runtime.Pinner)
	pin.Pin(p) // does nothing for C memory
	h := cgo.NewHandle(pin)
	viewsLive.Add(1)
	c := C.gorovod_new_view(C.TF_DataType(dtype), dimsPtr(shape), C.int(len(shape)), p,
		C.size_t(len(values)*dtype.byteSize()), C.uintptr_t(h))
	return adopt(c), nil
}

// viewsLive counts the buffers of NewTensorOver that TensorFlow still refers to.
var viewsLive atomic.Int64

//export gorovodReleaseView
func gorovodReleaseView(data unsafe.Pointer, size C.size_t, pin unsafe.Pointer) {
	h := cgo.Handle(uintptr(pin))
	h.Value().(*runtime.Pinner).Unpin()
	h.Delete()
	viewsLive.Add(-1)
}
