package trainer

import (
	"errors"
	"fmt"
	"unsafe"

	"github.com/gorovod/gorovod/bertgraph"
	"github.com/gorovod/gorovod/horovod"
)

// gradientBuffer allocates the flat gradients, which TrainStep writes, the Reducer sums in
// place and Apply reads, in host memory horovod hands out: with the NCCL backend, pinned memory
// its allreduce moves to and from the GPU by DMA where it lies, saving two host copies of every
// step's gradients through the backend's staging buffer (README, GPUs); with MPI and every rank
// on this machine, shared memory, which each rank sums its share of straight out of every
// rank's buffer (horovod/mpi: SHM_ALLREDUCE in the timeline); with MPI over several machines,
// Go memory. free gives the memory back; it must run before Shutdown, which frees lent memory,
// and nothing may read the gradients afterwards (the final checkpoint, evaluation and prediction
// read TensorFlow's variables, not these).
func (t *Trainer) gradientBuffer() (grads *bertgraph.FlatTensors, free func() error, err error) {
	n := 0
	for _, v := range t.model.Variables() {
		n += v.NumElements()
	}
	buf, err := t.hvd.AllocHost(4 * n)
	if err != nil {
		return nil, nil, fmt.Errorf("allocating the gradients (%d float32 values): %w", n, err)
	}
	mem := buf.Bytes()
	if mem == nil { // horovod stopped (its background loop failed) since AllocHost
		return nil, nil, errors.Join(fmt.Errorf("the gradients' buffer: %w", horovod.ErrShutdown), buf.Free())
	}
	values, err := float32View(mem)
	if err == nil {
		grads, err = t.model.FlatTensorsOver(values)
	}
	if err != nil {
		return nil, nil, errors.Join(fmt.Errorf("the gradients' buffer: %w", err), buf.Free())
	}
	if buf.Lent() {
		switch t.hvd.Backend() {
		case "nccl":
			t.infof("gradients in the nccl backend's pinned host memory (%.1f MB): its allreduce reads and writes them in place, no staging copy", float64(4*n)/1e6)
		case "mpi":
			t.infof("gradients in the mpi backend's shared memory (%.1f MB): the ranks on this machine sum them in place, each rank its share of all the ranks' gradients", float64(4*n)/1e6)
		default:
			t.infof("gradients in the %s backend's host memory (%.1f MB)", t.hvd.Backend(), float64(4*n)/1e6)
		}
	}
	return grads, buf.Free, nil
}

// float32View is b's memory as float32 values, without a copy: b must be aligned for float32
// (horovod's memory is: pinned memory is page-aligned, Go's make at least 8-aligned) and a whole
// number of them long.
func float32View(b []byte) ([]float32, error) {
	p := unsafe.Pointer(unsafe.SliceData(b))
	if uintptr(p)%4 != 0 || len(b)%4 != 0 {
		return nil, fmt.Errorf("%d bytes at %p are not an array of float32 (4-byte aligned, a multiple of 4 long)", len(b), p)
	}
	return unsafe.Slice((*float32)(p), len(b)/4), nil
}
