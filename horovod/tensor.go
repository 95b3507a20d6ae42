package horovod

import (
	"fmt"
	"math"
	"slices"
	"unsafe"

	"github.com/gorovod/gorovod/horovod/backend"
)

// DType is the element type of a Tensor (see package backend for the list).
type DType = backend.DType

// The element types horovod moves. Float16 tensors hold IEEE binary16 bit patterns (package fp16),
// BFloat16 tensors bfloat16 ones (package bf16).
const (
	Uint8    = backend.Uint8
	Int8     = backend.Int8
	Int32    = backend.Int32
	Int64    = backend.Int64
	Float16  = backend.Float16
	Float32  = backend.Float32
	Float64  = backend.Float64
	BFloat16 = backend.BFloat16
)

// Tensor is a dense row-major array in host memory: what TensorFlow hands back for a gradient.
// Data holds exactly NumElements()*DType.Size() bytes.
type Tensor struct {
	DType DType
	Shape []int
	Data  []byte
}

// NamedTensor is a tensor with the name every rank knows it by (a variable's name, say). Names
// are what ranks agree on, so they must be identical across ranks and unique among the
// operations a rank has in flight.
type NamedTensor struct {
	Name string
	Tensor
}

// NumElements is the product of the shape (1 for a scalar).
func (t Tensor) NumElements() int {
	n := 1
	for _, d := range t.Shape {
		n *= d
	}
	return n
}

// check reports a tensor whose data does not match its dtype and shape.
func (t Tensor) check() error {
	if err := checkShape(t.DType, t.Shape); err != nil {
		return err
	}
	if want := t.NumElements() * t.DType.Size(); len(t.Data) != want {
		return fmt.Errorf("%d bytes of data for %v%v (want %d)", len(t.Data), t.DType, t.Shape, want)
	}
	return nil
}

// checkShape reports a dtype or shape that describes no tensor: a rank's own tensors pass it
// before they are announced, and a peer's announced specs before they are trusted.
func checkShape(dt DType, shape []int) error {
	if !dt.Valid() {
		return fmt.Errorf("invalid dtype %v", dt)
	}
	if slices.ContainsFunc(shape, func(d int) bool { return d < 0 }) {
		return fmt.Errorf("negative dimension in shape %v", shape)
	}
	if !slices.Contains(shape, 0) {
		// The product would wrap around (to 0, say, and pass for empty data).
		for bytes, i := dt.Size(), 0; i < len(shape); i++ {
			if bytes > math.MaxInt/shape[i] {
				return fmt.Errorf("shape %v of %v is more bytes than an int counts", shape, dt)
			}
			bytes *= shape[i]
		}
	}
	return nil
}

// Element is a Go type a Tensor can be viewed as. uint16 stands for float16 bit patterns, and
// Values also views bfloat16 ones as uint16.
type Element interface {
	uint8 | int8 | int32 | int64 | uint16 | float32 | float64
}

// DTypeOf is the DType of an Element type (uint16 is Float16).
func DTypeOf[T Element]() DType {
	var zero T
	switch any(zero).(type) {
	case uint8:
		return Uint8
	case int8:
		return Int8
	case int32:
		return Int32
	case int64:
		return Int64
	case uint16:
		return Float16
	case float32:
		return Float32
	case float64:
		return Float64
	}
	panic("unreachable: Element lists exactly the cases above")
}

// NewTensor wraps values (not copied: the tensor aliases them) as a tensor of the given shape.
// A nil shape means a vector of len(values).
func NewTensor[T Element](shape []int, values []T) (Tensor, error) {
	if shape == nil {
		shape = []int{len(values)}
	}
	var data []byte
	if cap(values) > 0 {
		// The byte view keeps values' capacity, so that tensors sliced from one flat buffer are
		// seen to lie back to back and fuse in place.
		size := int(unsafe.Sizeof(values[:1][0]))
		data = unsafe.Slice((*byte)(unsafe.Pointer(&values[:1][0])), cap(values)*size)[:len(values)*size]
	}
	t := Tensor{DType: DTypeOf[T](), Shape: append([]int(nil), shape...), Data: data}
	if err := t.check(); err != nil {
		return Tensor{}, fmt.Errorf("horovod: NewTensor: %w", err)
	}
	return t, nil
}

// Values views t's data as a []T (not copied). T must match t.DType (uint16 for BFloat16 too).
func Values[T Element](t Tensor) ([]T, error) {
	if want := DTypeOf[T](); t.DType != want && !(want == Float16 && t.DType == BFloat16) {
		return nil, fmt.Errorf("horovod: tensor of %v viewed as %v", t.DType, want)
	}
	var zero T
	size := int(unsafe.Sizeof(zero))
	if len(t.Data)%size != 0 {
		return nil, fmt.Errorf("horovod: %d bytes are not a whole number of %v", len(t.Data), t.DType)
	}
	if len(t.Data) == 0 {
		return []T{}, nil
	}
	return unsafe.Slice((*T)(unsafe.Pointer(&t.Data[0])), len(t.Data)/size), nil
}
