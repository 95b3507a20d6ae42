package tf

/*
#include <tensorflow/c/tf_datatype.h>
*/
import "C"

import "fmt"

// DataType is a TensorFlow element type (the values of TF_DataType and types.proto).
type DataType int32

// The element types the binding reads and writes; other TensorFlow types still appear in
// signatures and checkpoints and print by name.
const (
	Float    DataType = C.TF_FLOAT
	Double   DataType = C.TF_DOUBLE
	Int32    DataType = C.TF_INT32
	Uint8    DataType = C.TF_UINT8
	String   DataType = C.TF_STRING
	Int64    DataType = C.TF_INT64
	Bool     DataType = C.TF_BOOL
	Half     DataType = C.TF_HALF // float16, held in Go as raw uint16 bits
	BFloat   DataType = C.TF_BFLOAT16
	Uint16   DataType = C.TF_UINT16
	Resource DataType = C.TF_RESOURCE
	Variant  DataType = C.TF_VARIANT
)

var dtypeNames = map[DataType]string{
	Float: "float32", Double: "float64", Int32: "int32", Uint8: "uint8", String: "string",
	Int64: "int64", Bool: "bool", Half: "float16", BFloat: "bfloat16", Uint16: "uint16",
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

// byteSize is the size of one element of the fixed-size types, 0 for the others.
func (t DataType) byteSize() int {
	switch t {
	case Float, Int32:
		return 4
	case Double, Int64:
		return 8
	case Bool, Uint8:
		return 1
	case Half, BFloat, Uint16:
		return 2
	}
	return 0
}
