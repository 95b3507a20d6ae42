package tf

/*
#include <stdlib.h>
#include <string.h>
#include <tensorflow/c/tf_tensor.h>
#include <tensorflow/c/tf_tstring.h>

// gorovod_free_strings is the deallocator of string tensors built from Go. TensorFlow calls it
// when the last reference to the buffer goes (the feed and any output aliasing it), so the
// heap parts of long strings are released exactly once.
static void gorovod_free_strings(void* data, size_t len, void* arg) {
	TF_TString* s = (TF_TString*)data;
	for (size_t i = 0; i < len / sizeof(TF_TString); i++) TF_StringDealloc(&s[i]);
	free(data);
}

static TF_Tensor* gorovod_new_strings(const int64_t* dims, int num_dims, int64_t n) {
	size_t len = (size_t)n * sizeof(TF_TString);
	// 64 is EIGEN_MAX_ALIGN_BYTES; aligned_alloc needs a multiple of the alignment.
	TF_TString* s = aligned_alloc(64, len == 0 ? 64 : (len + 63) / 64 * 64);
	if (s == NULL) return NULL;
	for (int64_t i = 0; i < n; i++) TF_StringInit(&s[i]);
	return TF_NewTensor(TF_STRING, dims, num_dims, s, len, gorovod_free_strings, NULL);
}

// gorovod_new_view wraps memory the caller owns (NewTensorOver, view.go); TensorFlow calls
// gorovodReleaseView with the pin's handle when it drops the last reference to it.
extern void gorovodReleaseView(void* data, size_t len, void* pin);

TF_Tensor* gorovod_new_view(TF_DataType dtype, const int64_t* dims, int num_dims, void* data, size_t len, uintptr_t pin) {
	return TF_NewTensor(dtype, dims, num_dims, data, len, gorovodReleaseView, (void*)pin);
}
*/
import "C"

import (
	"fmt"
	"math"
	"math/bits"
	"runtime"
	"strings"
	"unsafe"
)

// Scalar is the Go element types that map one to one onto a TensorFlow type and share its
// memory layout, so tensors copy to and from Go slices with a single memmove. float16 is not
// here because Go has no float16: see NewFloat16Tensor and Tensor.Float16Bits.
type Scalar interface {
	float32 | float64 | int32 | int64 | bool | uint8
}

// dtypeOf maps a Scalar type to its TensorFlow type.
func dtypeOf[T Scalar]() DataType {
	var zero T
	switch any(zero).(type) {
	case float32:
		return Float
	case float64:
		return Double
	case int32:
		return Int32
	case int64:
		return Int64
	case bool:
		return Bool
	default: // uint8
		return Uint8
	}
}

// Tensor is a TensorFlow tensor held in C memory. Close frees it; a cleanup frees it when it is
// garbage collected without Close, but tensors are large and the Go GC does not see C memory,
// so close them. A Tensor must not be used concurrently with its own Close.
type Tensor struct {
	c       *C.TF_Tensor
	dtype   DataType
	shape   []int64
	cleanup runtime.Cleanup
}

// freeTensor is the cleanup; it gets the C pointer, never the Tensor.
func freeTensor(c *C.TF_Tensor) { C.TF_DeleteTensor(c) }

// adopt wraps a TF_Tensor that the caller owns.
func adopt(c *C.TF_Tensor) *Tensor {
	t := &Tensor{c: c, dtype: DataType(C.TF_TensorType(c))}
	n := int(C.TF_NumDims(c))
	t.shape = make([]int64, n)
	for i := range n {
		t.shape[i] = int64(C.TF_Dim(c, C.int(i)))
	}
	t.cleanup = runtime.AddCleanup(t, freeTensor, c)
	return t
}

// Close frees the tensor's C memory. It is safe to call more than once.
func (t *Tensor) Close() {
	if t == nil || t.c == nil {
		return
	}
	t.cleanup.Stop()
	freeTensor(t.c)
	t.c = nil
}

// DataType is the element type.
func (t *Tensor) DataType() DataType { return t.dtype }

// Shape is a copy of the dimensions; empty for a scalar.
func (t *Tensor) Shape() []int64 { return append([]int64(nil), t.shape...) }

// NumElements is the product of the dimensions.
func (t *Tensor) NumElements() int64 { return numElements(t.shape) }

func (t *Tensor) String() string {
	if t == nil || t.c == nil {
		return "Tensor(closed)"
	}
	return fmt.Sprintf("Tensor(%s%s)", t.dtype, shapeString(t.shape))
}

func numElements(shape []int64) int64 {
	n := int64(1)
	for _, d := range shape {
		n *= d
	}
	return n
}

func shapeString(shape []int64) string {
	s := make([]string, len(shape))
	for i, d := range shape {
		if d < 0 {
			s[i] = "?"
		} else {
			s[i] = fmt.Sprint(d)
		}
	}
	return "[" + strings.Join(s, ",") + "]"
}

// maxRank is TensorShape::MaxDimensions().
const maxRank = 254

// checkShape validates a shape for n values of elemSize bytes. TensorFlow aborts the process
// (a failed CHECK) on a shape of more than maxRank dimensions or whose element count
// overflows int64 at any dimension, so those are errors here, as is a byte size past int64.
func checkShape(shape []int64, n, elemSize int) error {
	if len(shape) > maxRank {
		return fmt.Errorf("tf: shape of %d dimensions, TensorFlow allows %d", len(shape), maxRank)
	}
	limit := uint64(math.MaxInt64 / elemSize)
	elems := uint64(1)
	for _, d := range shape {
		if d < 0 {
			return fmt.Errorf("tf: shape %v has a negative dimension", shape)
		}
		hi, lo := bits.Mul64(elems, uint64(d))
		if hi != 0 || lo > limit {
			return fmt.Errorf("tf: shape %v has more than %d elements of %d bytes", shape, limit, elemSize)
		}
		elems = lo
	}
	if elems != uint64(n) {
		return fmt.Errorf("tf: shape %v holds %d values, got %d", shape, elems, n)
	}
	return nil
}

// allocate makes a TensorFlow-owned tensor of the given type and shape.
func allocate(dtype DataType, shape []int64, bytes int) *C.TF_Tensor {
	return C.TF_AllocateTensor(C.TF_DataType(dtype), dimsPtr(shape), C.int(len(shape)), C.size_t(bytes))
}

func dimsPtr(shape []int64) *C.int64_t {
	if len(shape) == 0 {
		return nil
	}
	return (*C.int64_t)(unsafe.Pointer(&shape[0]))
}

// data views a fixed-size tensor's memory as a Go slice of T.
func data[T any](c *C.TF_Tensor, n int) []T {
	if n == 0 {
		return nil
	}
	return unsafe.Slice((*T)(C.TF_TensorData(c)), n)
}

func newFixed[T Scalar | uint16](dtype DataType, values []T, shape []int64) (*Tensor, error) {
	if err := checkShape(shape, len(values), dtype.byteSize()); err != nil {
		return nil, err
	}
	c := allocate(dtype, shape, len(values)*dtype.byteSize())
	copy(data[T](c, len(values)), values)
	return adopt(c), nil
}

// NewTensor copies values into a new tensor of the given shape (no dimensions: a scalar).
// len(values) must equal the product of the dimensions.
func NewTensor[T Scalar](values []T, shape ...int64) (*Tensor, error) {
	return newFixed(dtypeOf[T](), values, shape)
}

// NewFloat16Tensor makes a float16 tensor from IEEE half-precision bit patterns
// (github.com/x448/float16's Float16 converts to and from them).
func NewFloat16Tensor(bits []uint16, shape ...int64) (*Tensor, error) {
	return newFixed(Half, bits, shape)
}

// NewStringTensor makes a string tensor; each Go string becomes one element (bytes, not
// necessarily UTF-8).
func NewStringTensor(values []string, shape ...int64) (*Tensor, error) {
	if err := checkShape(shape, len(values), C.sizeof_TF_TString); err != nil {
		return nil, err
	}
	c := C.gorovod_new_strings(dimsPtr(shape), C.int(len(shape)), C.int64_t(len(values)))
	if c == nil {
		return nil, fmt.Errorf("tf: no memory for a string tensor of %d elements (%d bytes of headers)", len(values), len(values)*C.sizeof_TF_TString)
	}
	elems := data[C.TF_TString](c, len(values))
	for i, s := range values {
		C.TF_StringCopy(&elems[i], (*C.char)(unsafe.Pointer(unsafe.StringData(s))), C.size_t(len(s)))
	}
	return adopt(c), nil
}

func (t *Tensor) check(want DataType) error {
	if t == nil || t.c == nil {
		return fmt.Errorf("tf: use of a closed tensor")
	}
	if t.dtype != want {
		return fmt.Errorf("tf: tensor is %s%s, read as %s", t.dtype, shapeString(t.shape), want)
	}
	return nil
}

func readFixed[T Scalar | uint16](t *Tensor, want DataType, dst []T) ([]T, error) {
	if err := t.check(want); err != nil {
		return nil, err
	}
	n := int(t.NumElements())
	if cap(dst) < n {
		dst = make([]T, n)
	}
	dst = dst[:n]
	copy(dst, data[T](t.c, n))
	// Until the copy ends t must stay reachable: its cleanup would free the memory being read.
	runtime.KeepAlive(t)
	return dst, nil
}

// Values copies the tensor's elements, in row-major order, into dst (reused when its capacity
// suffices, so a loop can read without allocating) and returns it. T must match the tensor's type.
func Values[T Scalar](t *Tensor, dst []T) ([]T, error) {
	return readFixed(t, dtypeOf[T](), dst)
}

// Float32s copies a float32 tensor's elements into a new slice.
func (t *Tensor) Float32s() ([]float32, error) { return Values[float32](t, nil) }

// Float64s copies a float64 tensor's elements into a new slice.
func (t *Tensor) Float64s() ([]float64, error) { return Values[float64](t, nil) }

// Int32s copies an int32 tensor's elements into a new slice.
func (t *Tensor) Int32s() ([]int32, error) { return Values[int32](t, nil) }

// Int64s copies an int64 tensor's elements into a new slice.
func (t *Tensor) Int64s() ([]int64, error) { return Values[int64](t, nil) }

// Bools copies a bool tensor's elements into a new slice.
func (t *Tensor) Bools() ([]bool, error) { return Values[bool](t, nil) }

// Float16Bits copies a float16 tensor's elements, as IEEE half-precision bits, into dst
// (reused when its capacity suffices).
func (t *Tensor) Float16Bits(dst []uint16) ([]uint16, error) { return readFixed(t, Half, dst) }

// Strings copies a string tensor's elements into new Go strings.
func (t *Tensor) Strings() ([]string, error) {
	if err := t.check(String); err != nil {
		return nil, err
	}
	elems := data[C.TF_TString](t.c, int(t.NumElements()))
	out := make([]string, len(elems))
	for i := range elems {
		p := C.TF_StringGetDataPointer(&elems[i])
		out[i] = C.GoStringN(p, C.int(C.TF_StringGetSize(&elems[i])))
	}
	runtime.KeepAlive(t)
	return out, nil
}

// shared tells whether TensorFlow holds another reference to the tensor's buffer;
// TF_TensorMaybeMove is the C API's "buffer refcount is one" test.
func (t *Tensor) shared() bool { return C.TF_TensorMaybeMove(t.c) == nil }

// Overwrite copies src into the tensor in place, keeping its type and shape, so a feed tensor
// can be refilled each step without allocating. When TensorFlow still shares the buffer (an
// output of a Run that aliases this feed is alive), writing in place would change that output,
// so Overwrite gives the tensor a fresh buffer instead.
func Overwrite[T Scalar](t *Tensor, src []T) error {
	return overwriteFixed(t, dtypeOf[T](), src)
}

// OverwriteFloat16 is Overwrite for a float16 tensor, from IEEE half-precision bits.
func (t *Tensor) OverwriteFloat16(bits []uint16) error { return overwriteFixed(t, Half, bits) }

func overwriteFixed[T Scalar | uint16](t *Tensor, dtype DataType, src []T) error {
	if err := t.check(dtype); err != nil {
		return err
	}
	n := int(t.NumElements())
	if len(src) != n {
		return fmt.Errorf("tf: overwrite of %s%s with %d values", t.dtype, shapeString(t.shape), len(src))
	}
	if t.shared() { // move to a buffer of our own
		c := allocate(dtype, t.shape, n*dtype.byteSize())
		t.cleanup.Stop()
		C.TF_DeleteTensor(t.c)
		t.c = c
		t.cleanup = runtime.AddCleanup(t, freeTensor, c)
	}
	copy(data[T](t.c, n), src)
	runtime.KeepAlive(t) // as in readFixed: no cleanup frees the memory being written
	return nil
}
