package tf

/*
#include <stdlib.h>
#include <tensorflow/c/c_api.h>
*/
import "C"

import (
	"fmt"
	"runtime"
	"strconv"
	"strings"
	"unsafe"
)

// Graph is a TensorFlow graph. LoadSavedModel fills one; NewGraph and Import build one from a
// serialized GraphDef. Lookups are safe for concurrent use.
type Graph struct {
	c       *C.TF_Graph
	cleanup runtime.Cleanup
}

func deleteGraph(c *C.TF_Graph) { C.TF_DeleteGraph(c) }

// NewGraph returns an empty graph.
func NewGraph() *Graph {
	g := &Graph{c: C.TF_NewGraph()}
	g.cleanup = runtime.AddCleanup(g, deleteGraph, g.c)
	return g
}

// Close frees the graph. TensorFlow keeps it alive until the sessions using it are closed.
func (g *Graph) Close() {
	if g == nil || g.c == nil {
		return
	}
	g.cleanup.Stop()
	deleteGraph(g.c)
	g.c = nil
}

// Import adds the operations of a serialized GraphDef, their names prefixed with prefix + "/"
// when prefix is not empty.
func (g *Graph) Import(graphDef []byte, prefix string) error {
	if len(graphDef) == 0 {
		return fmt.Errorf("tf: import of an empty GraphDef")
	}
	buf := C.TF_NewBufferFromString(unsafe.Pointer(&graphDef[0]), C.size_t(len(graphDef)))
	defer C.TF_DeleteBuffer(buf)
	opts := C.TF_NewImportGraphDefOptions()
	defer C.TF_DeleteImportGraphDefOptions(opts)
	cprefix := C.CString(prefix)
	defer C.free(unsafe.Pointer(cprefix))
	C.TF_ImportGraphDefOptionsSetPrefix(opts, cprefix)
	st := newStatus()
	defer st.delete()
	C.TF_GraphImportGraphDef(g.c, buf, opts, st.c)
	return st.err("import GraphDef")
}

// Operation returns the operation with the given name, or nil when there is none.
func (g *Graph) Operation(name string) *Operation {
	cname := C.CString(name)
	defer C.free(unsafe.Pointer(cname))
	c := C.TF_GraphOperationByName(g.c, cname)
	runtime.KeepAlive(g)
	if c == nil {
		return nil
	}
	return &Operation{c: c, g: g}
}

// Operations lists every operation of the graph, in TensorFlow's order.
func (g *Graph) Operations() []*Operation {
	var ops []*Operation
	var pos C.size_t
	for {
		c := C.TF_GraphNextOperation(g.c, &pos)
		if c == nil {
			break
		}
		ops = append(ops, &Operation{c: c, g: g})
	}
	runtime.KeepAlive(g)
	return ops
}

// Output resolves a tensor name "op:index" ("op" alone means index 0) to an Output.
func (g *Graph) Output(name string) (Output, error) {
	op, index, err := ParseTensorName(name)
	if err != nil {
		return Output{}, err
	}
	o := g.Operation(op)
	if o == nil {
		return Output{}, fmt.Errorf("tf: tensor %q: no operation %q in the graph", name, op)
	}
	if index >= o.NumOutputs() {
		return Output{}, fmt.Errorf("tf: tensor %q: operation %q (%s) has %d outputs", name, op, o.Type(), o.NumOutputs())
	}
	return Output{Op: o, Index: index}, nil
}

// ParseTensorName splits a tensor name "op:index" into the operation name and the output
// index; a name without ":" is output 0.
func ParseTensorName(name string) (op string, index int, err error) {
	op, idx, found := strings.Cut(name, ":")
	if op == "" {
		return "", 0, fmt.Errorf("tf: tensor name %q has no operation name", name)
	}
	if !found {
		return op, 0, nil
	}
	index, err = strconv.Atoi(idx)
	if err != nil || index < 0 || strings.ContainsAny(idx, "+-") {
		return "", 0, fmt.Errorf("tf: tensor name %q: output index %q is not a non-negative integer", name, idx)
	}
	return op, index, nil
}

// Operation is a node of a Graph.
type Operation struct {
	c *C.TF_Operation
	g *Graph
}

// Name is the operation's unique name in its graph.
func (op *Operation) Name() string { return C.GoString(C.TF_OperationName(op.c)) }

// Type is the operation's type, e.g. "MatMul".
func (op *Operation) Type() string { return C.GoString(C.TF_OperationOpType(op.c)) }

// Device is the device the operation was placed on in the GraphDef ("" when unset).
func (op *Operation) Device() string { return C.GoString(C.TF_OperationDevice(op.c)) }

// NumOutputs is the number of tensors the operation produces.
func (op *Operation) NumOutputs() int { return int(C.TF_OperationNumOutputs(op.c)) }

// Output is the operation's i-th output.
func (op *Operation) Output(i int) Output { return Output{Op: op, Index: i} }

// Output is one tensor produced by an operation, named "op:index".
type Output struct {
	Op    *Operation
	Index int
}

func (o Output) c() C.TF_Output { return C.TF_Output{oper: o.Op.c, index: C.int(o.Index)} }

// Name is "op:index".
func (o Output) Name() string { return o.Op.Name() + ":" + strconv.Itoa(o.Index) }

func (o Output) String() string { return o.Name() }

// DataType is the type of the tensor.
func (o Output) DataType() DataType { return DataType(C.TF_OperationOutputType(o.c())) }

// Shape is the static shape the graph knows for the tensor: dimensions of -1 are unknown, and
// ok is false when even the rank is unknown.
func (o Output) Shape() (dims []int64, ok bool, err error) {
	st := newStatus()
	defer st.delete()
	n := C.TF_GraphGetTensorNumDims(o.Op.g.c, o.c(), st.c)
	if err := st.err("shape of " + o.Name()); err != nil {
		return nil, false, err
	}
	if n < 0 {
		return nil, false, nil
	}
	dims = make([]int64, n)
	if n > 0 {
		C.TF_GraphGetTensorShape(o.Op.g.c, o.c(), (*C.int64_t)(unsafe.Pointer(&dims[0])), n, st.c)
		if err := st.err("shape of " + o.Name()); err != nil {
			return nil, false, err
		}
	}
	runtime.KeepAlive(o.Op.g)
	return dims, true, nil
}
