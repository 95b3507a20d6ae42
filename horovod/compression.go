package horovod

import (
	"fmt"

	"github.com/gorovod/gorovod/horovod/fp16"
	"github.com/gorovod/gorovod/horovod/internal/parallel"
)

// Compression is how a Reducer puts gradients on the wire (Horovod's Compression.none and
// Compression.fp16).
type Compression uint8

const (
	// NoCompression sends tensors as they are.
	NoCompression Compression = iota
	// FP16Compression sends float32 and float64 tensors as float16, halving or quartering the
	// bytes moved; integer and float16 tensors pass through unchanged. Values beyond ±65504
	// become infinities, so it suits gradients, not arbitrary data.
	FP16Compression
)

func (c Compression) String() string {
	switch c {
	case NoCompression:
		return "none"
	case FP16Compression:
		return "fp16"
	}
	return fmt.Sprintf("Compression(%d)", uint8(c))
}

// compresses reports whether c changes the wire dtype of a tensor of type dt.
func (c Compression) compresses(dt DType) bool {
	return c == FP16Compression && (dt == Float32 || dt == Float64)
}

// compress narrows src (float32 or float64) into the float16 buffer dst, over up to workers
// goroutines when src is large.
func compress(dst []byte, src []byte, dt DType, workers int) {
	h := view[uint16](dst)
	switch dt {
	case Float32:
		fp16.EncodeFloat32Parallel(h, view[float32](src), workers)
	case Float64:
		fp16.EncodeFloat64Parallel(h, view[float64](src), workers)
	}
}

// widenBlock is how many elements decompress widens and then scales while they are in the
// second-level cache, instead of making a second pass over memory to scale: on a 16-core H200
// host, where one core's share of the memory bandwidth is small, that pass is much of the cost.
// Blocks of 2048 cost 9% on a 2-core machine where scaling, not memory, bounds a core; blocks of
// 8192 cost nothing there (measured).
const widenBlock = 8192

// decompress widens the float16 buffer src into dst (float32 or float64) and multiplies by factor,
// so that averaging happens at full precision after the reduction; over up to workers goroutines
// when src is large. The result does not depend on workers.
func decompress(dst []byte, src []byte, dt DType, factor float64, workers int) {
	h := view[uint16](src)
	if factor == 1 {
		switch dt {
		case Float32:
			fp16.DecodeFloat32Parallel(view[float32](dst), h, workers)
		case Float64:
			fp16.DecodeFloat64Parallel(view[float64](dst), h, workers)
		}
		return
	}
	size := dt.Size()
	parallel.For(len(h), size, passAlign, workers, func(lo, hi int) {
		for b := lo; b < hi; b += widenBlock {
			e := min(b+widenBlock, hi)
			part := dst[b*size : e*size]
			switch dt {
			case Float32:
				fp16.DecodeFloat32(view[float32](part), h[b:e])
			case Float64:
				fp16.DecodeFloat64(view[float64](part), h[b:e])
			}
			scaleRange(part, dt, factor)
		}
	})
}
