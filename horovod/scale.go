package horovod

import (
	"unsafe"

	"github.com/gorovod/gorovod/horovod/internal/parallel"
)

// passAlign is how many elements every piece of a pass split over goroutines is a multiple of
// (but the last): F16C converts eight at a time, and 64 elements are whole cache lines for
// every dtype, so no two goroutines write the same line.
const passAlign = 64

// scale multiplies every element of buf by f in place (Horovod's prescale and postscale), split
// over up to workers goroutines when buf is large. Each element is scaled on its own, so the
// result does not depend on workers.
func scale(buf []byte, dt DType, f float64, workers int) {
	if f == 1 || len(buf) == 0 {
		return
	}
	size := dt.Size()
	parallel.For(len(buf)/size, size, passAlign, workers, func(lo, hi int) {
		scaleRange(buf[lo*size:hi*size], dt, f)
	})
}

// scaleRange is scale on one goroutine. Floats are scaled in float64 and rounded once; integers
// are scaled in float64 and truncated toward zero, as Horovod's C++ does; float16 and bfloat16 are
// scaled in float32, blockwise (halfCodec).
func scaleRange(buf []byte, dt DType, f float64) {
	if f == 1 || len(buf) == 0 {
		return
	}
	switch dt {
	case Float32:
		v := view[float32](buf)
		if f32 := float32(f); float64(f32) == f {
			// The product of two float32s is exact in float64, so multiplying in float32 rounds
			// once too, and is about twice as fast.
			for i := simdPrefix(len(v), 8, func(n int) { scaleFloat32AVX(&v[0], n, f32) }); i < len(v); i++ {
				v[i] *= f32
			}
			return
		}
		for i := simdPrefix(len(v), 4, func(n int) { scaleFloat32ViaFloat64AVX(&v[0], n, f) }); i < len(v); i++ {
			v[i] = float32(float64(v[i]) * f)
		}
	case Float64:
		v := view[float64](buf)
		for i := simdPrefix(len(v), 4, func(n int) { scaleFloat64AVX(&v[0], n, f) }); i < len(v); i++ {
			v[i] *= f
		}
	case Float16, BFloat16:
		codec, _ := codecOf(dt)
		f32 := float32(f)
		codec.mapHalves(view[uint16](buf), nil, func(x, _ []float32) {
			for i := range x {
				x[i] *= f32
			}
		})
	case Int32:
		scaleInts(view[int32](buf), f)
	case Int64:
		scaleInts(view[int64](buf), f)
	case Int8:
		scaleInts(view[int8](buf), f)
	case Uint8:
		scaleInts(view[uint8](buf), f)
	}
}

// simdPrefix runs simd over the longest prefix of n elements that is a whole number of width
// lanes, where the CPU has AVX, and returns its length: the scalar loop does the rest.
func simdPrefix(n, width int, simd func(n int)) int {
	if !hasAVX {
		return 0
	}
	n = n / width * width
	if n > 0 {
		simd(n)
	}
	return n
}

func scaleInts[T int8 | uint8 | int32 | int64](v []T, f float64) {
	for i := range v {
		v[i] = T(float64(v[i]) * f)
	}
}

// view reinterprets buf (whose length is a multiple of T's size) as a []T without copying. An
// empty buf (a tensor with a zero dimension) is an empty view: every operation on it is a no-op.
func view[T any](buf []byte) []T {
	if len(buf) == 0 {
		return nil
	}
	var zero T
	return unsafe.Slice((*T)(unsafe.Pointer(&buf[0])), len(buf)/int(unsafe.Sizeof(zero)))
}
