package horovod

import "golang.org/x/sys/cpu"

// hasAVX: scaleRange multiplies float32 and float64 buffers eight or four lanes at a time. A
// scalar Go loop multiplies one element per instruction, which made Average's pass over a 1 MiB
// result take longer than the allreduce's own copy.
var hasAVX = cpu.X86.HasAVX

// scaleFloat32AVX multiplies n float32s (n a positive multiple of 8) by f in place.
//
//go:noescape
func scaleFloat32AVX(v *float32, n int, f float32)

// scaleFloat32ViaFloat64AVX computes float32(float64(x) * f) for n float32s (n a positive
// multiple of 4) in place.
//
//go:noescape
func scaleFloat32ViaFloat64AVX(v *float32, n int, f float64)

// scaleFloat64AVX multiplies n float64s (n a positive multiple of 4) by f in place.
//
//go:noescape
func scaleFloat64AVX(v *float64, n int, f float64)
