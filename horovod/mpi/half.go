package mpi

import "C"

import (
	"math"
	"unsafe"

	"github.com/gorovod/gorovod/horovod/backend"
	"github.com/gorovod/gorovod/horovod/bf16"
	"github.com/gorovod/gorovod/horovod/fp16"
)

// halfBlock is how many halves are widened at a time, on the stack of the calling thread.
const halfBlock = 2048

// hvdHalfReduce is the body of the float16 and bfloat16 MPI operators (bfloat16 != 0 says
// which): inout[i] = op(in[i], inout[i]), computed in float32 and rounded back to nearest even.
// MPI calls it on the thread of the allreduce.
//
//export hvdHalfReduce
func hvdHalfReduce(in, inout unsafe.Pointer, n C.int, op C.int, bfloat16 C.int) {
	encode, decode := fp16.EncodeFloat32, fp16.DecodeFloat32
	if bfloat16 != 0 {
		encode, decode = bf16.EncodeFloat32, bf16.DecodeFloat32
	}
	a := unsafe.Slice((*uint16)(in), int(n))
	b := unsafe.Slice((*uint16)(inout), int(n))
	var fa, fb [halfBlock]float32
	for off := 0; off < len(a); off += halfBlock {
		m := min(halfBlock, len(a)-off)
		x, y := fa[:m], fb[:m]
		decode(x, a[off:off+m])
		decode(y, b[off:off+m])
		switch backend.ReduceOp(op) {
		case backend.Sum:
			for i := range y {
				y[i] += x[i]
			}
		case backend.Min:
			for i := range y {
				y[i] = float32(math.Min(float64(x[i]), float64(y[i])))
			}
		case backend.Max:
			for i := range y {
				y[i] = float32(math.Max(float64(x[i]), float64(y[i])))
			}
		case backend.Product:
			for i := range y {
				y[i] *= x[i]
			}
		}
		encode(b[off:off+m], y)
	}
}

// sumHalves is the shared-memory allreduce's sum of float16 or bfloat16 (sharedAllreducePart):
// elements lo..hi-1 of every buffer, widened a block at a time, added in buffer (rank) order
// and rounded back to nearest even after each addition, as hvdHalfReduce does for MPI (so 2
// ranks give MPI's result to the bit); the sum is written into every buffer.
func sumHalves(bufs []unsafe.Pointer, lo, hi int, bfloat16 bool) {
	encode, decode := fp16.EncodeFloat32, fp16.DecodeFloat32
	if bfloat16 {
		encode, decode = bf16.EncodeFloat32, bf16.DecodeFloat32
	}
	halves := make([][]uint16, len(bufs))
	for p, b := range bufs {
		halves[p] = unsafe.Slice((*uint16)(b), hi)
	}
	var acc, next [halfBlock]float32
	var rounded [halfBlock]uint16
	for off := lo; off < hi; off += halfBlock {
		end := min(off+halfBlock, hi)
		sum, x, h := acc[:end-off], next[:end-off], rounded[:end-off]
		decode(sum, halves[0][off:end])
		for p := 1; p < len(halves); p++ {
			decode(x, halves[p][off:end])
			for i := range sum {
				sum[i] += x[i]
			}
			encode(h, sum)
			if p < len(halves)-1 {
				decode(sum, h)
			}
		}
		for _, b := range halves {
			copy(b[off:end], h)
		}
	}
}
