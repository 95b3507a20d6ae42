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
	"sync"
	"unsafe"
)

// Graph is a TensorFlow graph. LoadSavedModel fills one; NewGraph and Import build one from a
// serialized GraphDef. Lookups are safe for concurrent use, also with Close: after Close,
// Operation returns nil, the methods that return an error fail with ErrClosed, and those of
// its Operations and Outputs return zero values (Shape an error).
type Graph struct {
	// mu guards c: the methods hold it for reading while they use c, Close for writing, so
	// Close waits for the lookups in flight and the later ones see c == nil.
	mu      sync.RWMutex
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
	if g == nil {
		return
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.c == nil {
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
	g.mu.RLock()
	defer g.mu.RUnlock()
	if g.c == nil {
		return errClosed("graph")
	}
	st := newStatus()
	defer st.delete()
	C.TF_GraphImportGraphDef(g.c, buf, opts, st.c)
	return st.err("import GraphDef")
}

// Operation returns the operation with the given name, or nil when there is none or the graph
// is closed.
func (g *Graph) Operation(name string) *Operation {
	g.mu.RLock()
	defer g.mu.RUnlock()
	if g.c == nil {
		return nil
	}
	cname := C.CString(name)
	defer C.free(unsafe.Pointer(cname))
	c := C.TF_GraphOperationByName(g.c, cname)
	runtime.KeepAlive(g)
	if c == nil {
		return nil
	}
	return &Operation{c: c, g: g}
}

// Operations lists every operation of the graph, in TensorFlow's order (none once closed).
func (g *Graph) Operations() []*Operation {
	g.mu.RLock()
	defer g.mu.RUnlock()
	if g.c == nil {
		return nil
	}
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
		if g.closed() {
			return Output{}, fmt.Errorf("tf: tensor %q: %w", name, errClosed("graph"))
		}
		return Output{}, fmt.Errorf("tf: tensor %q: no operation %q in the graph", name, op)
	}
	if index >= o.NumOutputs() {
		return Output{}, fmt.Errorf("tf: tensor %q: operation %q (%s) has %d outputs", name, op, o.Type(), o.NumOutputs())
	}
	return Output{Op: o, Index: index}, nil
}

func (g *Graph) closed() bool {
	g.mu.RLock()
	defer g.mu.RUnlock()
	return g.c == nil
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

// describe returns what f reads from the operation, or the zero value once the graph is
// closed: the TF_Operation is freed with the graph.
func describe[T any](op *Operation, f func(*Operation) T) T {
	op.g.mu.RLock()
	defer op.g.mu.RUnlock()
	if op.g.c == nil {
		var zero T
		return zero
	}
	return f(op)
}

// Name is the operation's unique name in its graph ("" once the graph is closed).
func (op *Operation) Name() string { return describe(op, (*Operation).nameLocked) }

// nameLocked is Name for a caller that holds op.g.mu and saw the graph open (a second read
// lock could deadlock behind a waiting Close).
func (op *Operation) nameLocked() string { return C.GoString(C.TF_OperationName(op.c)) }

// Type is the operation's type, e.g. "MatMul" ("" once the graph is closed).
func (op *Operation) Type() string {
	return describe(op, func(op *Operation) string { return C.GoString(C.TF_OperationOpType(op.c)) })
}

// Device is the device the operation was placed on in the GraphDef ("" when unset or once the
// graph is closed).
func (op *Operation) Device() string {
	return describe(op, func(op *Operation) string { return C.GoString(C.TF_OperationDevice(op.c)) })
}

// NumOutputs is the number of tensors the operation produces (0 once the graph is closed).
func (op *Operation) NumOutputs() int {
	return describe(op, func(op *Operation) int { return int(C.TF_OperationNumOutputs(op.c)) })
}

// Output is the operation's i-th output. The index is checked where the output is used:
// Session.Run, DataType and Shape reject one out of range.
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

// checkLocked tells why o is not an output of an open graph; the caller holds o.Op.g.mu.
func (o Output) checkLocked() error {
	if o.Op.g.c == nil {
		return errClosed("graph")
	}
	// TensorFlow does not check the index: it would read past the operation's outputs.
	if n := int(C.TF_OperationNumOutputs(o.Op.c)); o.Index < 0 || o.Index >= n {
		name := o.Op.nameLocked()
		return fmt.Errorf("tf: output %s:%d: operation %q (%s) has %d outputs", name, o.Index, name, C.GoString(C.TF_OperationOpType(o.Op.c)), n)
	}
	return nil
}

// check tells why o is not an output of an open graph: a zero Output, a closed graph or an
// index out of range.
func (o Output) check() error {
	if o.Op == nil {
		return fmt.Errorf("tf: output %d of no operation (a zero Output)", o.Index)
	}
	o.Op.g.mu.RLock()
	defer o.Op.g.mu.RUnlock()
	return o.checkLocked()
}

// DataType is the type of the tensor; 0 (invalid) when o is not an output of an open graph.
func (o Output) DataType() DataType {
	if o.Op == nil {
		return 0
	}
	o.Op.g.mu.RLock()
	defer o.Op.g.mu.RUnlock()
	if o.checkLocked() != nil {
		return 0
	}
	return DataType(C.TF_OperationOutputType(o.c()))
}

// Shape is the static shape the graph knows for the tensor: dimensions of -1 are unknown, and
// ok is false when even the rank is unknown.
func (o Output) Shape() (dims []int64, ok bool, err error) {
	if o.Op == nil {
		return nil, false, o.check()
	}
	o.Op.g.mu.RLock()
	defer o.Op.g.mu.RUnlock()
	if err := o.checkLocked(); err != nil {
		return nil, false, err
	}
	st := newStatus()
	defer st.delete()
	n := C.TF_GraphGetTensorNumDims(o.Op.g.c, o.c(), st.c)
	if st.ok() && n >= 0 {
		dims = make([]int64, n)
		if n > 0 {
			C.TF_GraphGetTensorShape(o.Op.g.c, o.c(), (*C.int64_t)(unsafe.Pointer(&dims[0])), n, st.c)
		}
	}
	if !st.ok() { // the context is built only for errors: Run checks every feed's shape
		return nil, false, st.err("shape of " + o.Op.nameLocked() + ":" + strconv.Itoa(o.Index))
	}
	runtime.KeepAlive(o.Op.g)
	return dims, n >= 0, nil
}
