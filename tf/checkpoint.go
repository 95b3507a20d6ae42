package tf

/*
#include <stdlib.h>
#include <tensorflow/c/c_api_experimental.h>
*/
import "C"

import (
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"sync"
	"unsafe"
)

// CheckpointReader reads the variables of a TensorFlow checkpoint (V1 or V2, TF1 Saver or TF2
// tf.train.Checkpoint, e.g. Google BERT's bert_model.ckpt) without a graph. It is safe for
// concurrent use.
type CheckpointReader struct {
	prefix  string
	mu      sync.Mutex
	c       *C.TF_CheckpointReader
	cleanup runtime.Cleanup
	vars    []VariableInfo
}

// VariableInfo is one variable of a checkpoint.
type VariableInfo struct {
	Name  string
	DType DataType
	Shape []int64
}

func deleteCheckpointReader(c *C.TF_CheckpointReader) { C.TF_DeleteCheckpointReader(c) }

// OpenCheckpoint opens the checkpoint with the given prefix (the path without .index or
// .data-*, as tf.train.latest_checkpoint gives it).
func OpenCheckpoint(prefix string) (*CheckpointReader, error) {
	cprefix := C.CString(prefix)
	defer C.free(unsafe.Pointer(cprefix))
	st := newStatus()
	defer st.delete()
	c := C.TF_NewCheckpointReader(cprefix, st.c)
	if err := st.err("open checkpoint " + prefix); err != nil {
		return nil, err
	}
	r := &CheckpointReader{prefix: prefix, c: c}
	r.cleanup = runtime.AddCleanup(r, deleteCheckpointReader, c)
	n := int(C.TF_CheckpointReaderSize(c))
	r.vars = make([]VariableInfo, n)
	for i := range n {
		cname := C.TF_CheckpointReaderGetVariable(c, C.int(i))
		v := &r.vars[i]
		v.Name = C.GoString(cname)
		v.DType = DataType(C.TF_CheckpointReaderGetVariableDataType(c, cname))
		v.Shape = make([]int64, int(C.TF_CheckpointReaderGetVariableNumDims(c, cname)))
		if len(v.Shape) > 0 {
			C.TF_CheckpointReaderGetVariableShape(c, cname, (*C.int64_t)(unsafe.Pointer(&v.Shape[0])), C.int(len(v.Shape)), st.c)
			if err := st.err(fmt.Sprintf("checkpoint %s: shape of %s", prefix, v.Name)); err != nil {
				r.Close()
				return nil, err
			}
		}
	}
	slices.SortFunc(r.vars, func(a, b VariableInfo) int { return strings.Compare(a.Name, b.Name) })
	return r, nil
}

// Close frees the reader.
func (r *CheckpointReader) Close() {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.c == nil {
		return
	}
	r.cleanup.Stop()
	deleteCheckpointReader(r.c)
	r.c = nil
}

// Variables lists the checkpoint's variables sorted by name. TF2 checkpoints also hold
// "_CHECKPOINTABLE_OBJECT_GRAPH", the serialized object graph.
func (r *CheckpointReader) Variables() []VariableInfo {
	out := make([]VariableInfo, len(r.vars))
	for i, v := range r.vars {
		out[i] = v.clone()
	}
	return out
}

// Variable describes the variable with the given name.
func (r *CheckpointReader) Variable(name string) (VariableInfo, bool) {
	i, ok := slices.BinarySearchFunc(r.vars, name, func(v VariableInfo, n string) int { return strings.Compare(v.Name, n) })
	if !ok {
		return VariableInfo{}, false
	}
	return r.vars[i].clone(), true
}

// clone copies the shape, so a caller changing it cannot change the reader's.
func (v VariableInfo) clone() VariableInfo {
	v.Shape = slices.Clone(v.Shape)
	return v
}

// Read returns the value of the variable with the given name; the caller closes it.
func (r *CheckpointReader) Read(name string) (*Tensor, error) {
	if _, ok := r.Variable(name); !ok {
		return nil, fmt.Errorf("tf: checkpoint %s has no variable %q", r.prefix, name)
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.c == nil {
		return nil, fmt.Errorf("tf: checkpoint %s: reader is closed", r.prefix)
	}
	cname := C.CString(name)
	defer C.free(unsafe.Pointer(cname))
	st := newStatus()
	defer st.delete()
	c := C.TF_CheckpointReaderGetTensor(r.c, cname, st.c)
	if err := st.err(fmt.Sprintf("checkpoint %s: read %s", r.prefix, name)); err != nil {
		return nil, err
	}
	return adopt(c), nil
}

// VerifyCheckpoint reads every variable of the checkpoint prefix, as a restore would, and
// reports the first that fails: a damaged checkpoint (a truncated data file, a checksum that
// does not match) is found before a restore stops on it. The error names the damaged file.
func VerifyCheckpoint(prefix string) error {
	r, err := OpenCheckpoint(prefix)
	if err != nil {
		return fmt.Errorf("%s.index is damaged: %w", prefix, err)
	}
	defer r.Close()
	for _, v := range r.vars {
		t, err := r.Read(v.Name)
		if err != nil {
			return fmt.Errorf("%s is damaged: %w", dataFiles(prefix), err)
		}
		t.Close()
	}
	return nil
}

// dataFiles names the data files of the checkpoint prefix: the one shard when there is one
// (prefix.data-00000-of-00001), else the pattern prefix.data-*.
func dataFiles(prefix string) string {
	entries, err := os.ReadDir(filepath.Dir(prefix))
	if err != nil {
		return prefix + ".data-*"
	}
	var shards []string
	for _, e := range entries {
		if strings.HasPrefix(e.Name(), filepath.Base(prefix)+".data-") {
			shards = append(shards, e.Name())
		}
	}
	if len(shards) != 1 {
		return prefix + ".data-*"
	}
	return filepath.Join(filepath.Dir(prefix), shards[0])
}
