package tf

/*
#include <tensorflow/c/tf_datatype.h>
*/
import "C"

import "fmt"

// DataType is a TensorFlow element type (the values of TF_DataType and types.proto).
type DataType int32

// The element types the binding reads and writes, and a few more that appear in signatures
// and checkpoints (the values of TF_DataType, fixed by types.proto). Other types print as
// dtype(N).
const (
	Float    DataType = 1
	Double   DataType = 2
	Int32    DataType = 3
	Uint8    DataType = 4
	String   DataType = 7
	Int64    DataType = 9
	Bool     DataType = 10
	BFloat16 DataType = 14
	Uint16   DataType = 17
	Half     DataType = 19 // float16, held in Go as raw IEEE bits (uint16)
	Resource DataType = 20
	Variant  DataType = 21
)

// Each literal above is TF_DataType's; a mismatch makes an array of non-zero length here,
// which does not compile.
var (
	_ [0]struct{} = [Float - C.TF_FLOAT]struct{}{}
	_ [0]struct{} = [Double - C.TF_DOUBLE]struct{}{}
	_ [0]struct{} = [Int32 - C.TF_INT32]struct{}{}
	_ [0]struct{} = [Uint8 - C.TF_UINT8]struct{}{}
	_ [0]struct{} = [String - C.TF_STRING]struct{}{}
	_ [0]struct{} = [Int64 - C.TF_INT64]struct{}{}
	_ [0]struct{} = [Bool - C.TF_BOOL]struct{}{}
	_ [0]struct{} = [BFloat16 - C.TF_BFLOAT16]struct{}{}
	_ [0]struct{} = [Uint16 - C.TF_UINT16]struct{}{}
	_ [0]struct{} = [Half - C.TF_HALF]struct{}{}
	_ [0]struct{} = [Resource - C.TF_RESOURCE]struct{}{}
	_ [0]struct{} = [Variant - C.TF_VARIANT]struct{}{}
)

var dtypeNames = map[DataType]string{
	Float: "float32", Double: "float64", Int32: "int32", Uint8: "uint8", String: "string",
	Int64: "int64", Bool: "bool", Half: "float16", BFloat16: "bfloat16", Uint16: "uint16",
	Resource: "resource", Variant: "variant",
	C.TF_INT16: "int16", C.TF_INT8: "int8", C.TF_COMPLEX64: "complex64",
	C.TF_COMPLEX128: "complex128", C.TF_UINT32: "uint32", C.TF_UINT64: "uint64",
}

// String gives numpy-style names (float32, int64, ...), the names Python TensorFlow prints.
func (t DataType) String() string {
	if n, ok := dtypeNames[t]; ok {
		return n
	}
	return fmt.Sprintf("dtype(%d)", int32(t))
}

// refOffset is what types.proto adds to a type for a reference to a tensor of it: DT_FLOAT_REF
// (101) is the type of a TF1 variable's output when the variable is not a resource.
const refOffset = 100

// base is the type a reference type refers to, which TensorFlow takes for a feed of it; any
// other type is its own base.
func (t DataType) base() DataType {
	if t > refOffset {
		return t - refOffset
	}
	return t
}

// byteSize is the size of one element of the fixed-size types, 0 for the others.
func (t DataType) byteSize() int {
	switch t {
	case Float, Int32:
		return 4
	case Double, Int64:
		return 8
	case Bool, Uint8:
		return 1
	case Half, BFloat16, Uint16:
		return 2
	}
	return 0
}
