package fp16

import "github.com/gorovod/gorovod/horovod/internal/parallel"

// The bulk conversions of large slices (horovod's fp16 compression of a gradient) split the
// work over up to workers goroutines with parallel.For, which leaves slices under a few
// megabytes to the calling goroutine. Every piece but the last is a multiple of F16C's eight
// lanes long, so it converts wholly in assembly; every element converts on its own, so the
// result is that of the single-goroutine conversion, bit for bit, whatever workers is.

// EncodeFloat32Parallel is EncodeFloat32 over up to workers goroutines.
func EncodeFloat32Parallel(dst []uint16, src []float32, workers int) {
	split(dst, src, 4, workers, EncodeFloat32)
}

// DecodeFloat32Parallel is DecodeFloat32 over up to workers goroutines.
func DecodeFloat32Parallel(dst []float32, src []uint16, workers int) {
	split(dst, src, 4, workers, DecodeFloat32)
}

// EncodeFloat64Parallel is EncodeFloat64 over up to workers goroutines.
func EncodeFloat64Parallel(dst []uint16, src []float64, workers int) {
	split(dst, src, 8, workers, EncodeFloat64)
}

// DecodeFloat64Parallel is DecodeFloat64 over up to workers goroutines.
func DecodeFloat64Parallel(dst []float64, src []uint16, workers int) {
	split(dst, src, 8, workers, DecodeFloat64)
}

// lanes is how many values one F16C instruction converts.
const lanes = 8

// split runs convert on matching pieces of dst and src; wideBytes is the size of the wider
// element, which sets how many elements make a piece worth a goroutine.
func split[D, S any](dst []D, src []S, wideBytes, workers int, convert func([]D, []S)) {
	dst = dst[:len(src)]
	parallel.For(len(src), wideBytes, lanes, workers, func(lo, hi int) { convert(dst[lo:hi], src[lo:hi]) })
}
