// Package fp16 converts between IEEE 754 binary16 ("half") and float32/float64, one value at a
// time or in bulk. Narrowing rounds to nearest, ties to even; values too large for a half become
// infinities, values too small become subnormals or signed zeros, and NaNs stay NaNs (quieted, with
// the top payload bits kept, as x86's F16C does). On x86-64 CPUs with F16C the bulk float32
// conversions run eight lanes at a time in assembly; elsewhere a portable loop gives bit-identical
// results.
//
// Halves are carried as their bit patterns in uint16, which is what crosses the wire in
// horovod's fp16 compression and what TensorFlow's DT_HALF tensors hold.
package fp16

import (
	"math"

	"github.com/gorovod/gorovod/horovod/internal/bulk"
)

// ToFloat32 widens a half to float32 exactly.
func ToFloat32(h uint16) float32 {
	sign := uint32(h&0x8000) << 16
	exp := uint32(h>>10) & 0x1f
	man := uint32(h & 0x3ff)
	switch {
	case exp == 0x1f && man != 0: // NaN: quieted, payload kept
		return math.Float32frombits(sign | 0x7fc00000 | man<<13)
	case exp == 0x1f:
		return math.Float32frombits(sign | 0x7f800000)
	case exp != 0:
		return math.Float32frombits(sign | (exp+112)<<23 | man<<13)
	case man == 0:
		return math.Float32frombits(sign)
	}
	// Subnormal: man * 2^-24, normalized so the leading one becomes implicit.
	e := uint32(113)
	for man&0x400 == 0 {
		man <<= 1
		e--
	}
	return math.Float32frombits(sign | e<<23 | (man&0x3ff)<<13)
}

// ToFloat64 widens a half to float64 exactly.
func ToFloat64(h uint16) float64 { return float64(ToFloat32(h)) }

// FromFloat32 narrows f to the nearest half, ties to even. Widening to float64 is exact, so this
// rounds once.
func FromFloat32(f float32) uint16 { return FromFloat64(float64(f)) }

// FromFloat64 narrows f to the nearest half, ties to even.
func FromFloat64(f float64) uint16 {
	b := math.Float64bits(f)
	sign := uint16(b>>48) & 0x8000
	exp := int(b>>52) & 0x7ff
	man := b & (1<<52 - 1)
	switch {
	case exp == 0x7ff && man != 0:
		return sign | 0x7e00 | uint16(man>>42)&0x3ff
	case exp == 0x7ff:
		return sign | 0x7c00
	case exp == 0: // float64 zero or subnormal: far below half's range
		return sign
	}
	e := exp - 1023
	m := man | 1<<52 // 53 significant bits
	if e >= -14 {
		// Normal half: keep the top 11 bits of m.
		keep := roundShift(m, 42)
		if keep == 1<<11 { // rounding carried into a new binade
			keep >>= 1
			e++
		}
		if e > 15 {
			return sign | 0x7c00
		}
		return sign | uint16(e+15)<<10 | uint16(keep)&0x3ff
	}
	// Subnormal half: count units of 2^-24. m*2^(e-52) / 2^-24 = m >> (28-e).
	s := uint(28 - e)
	if s > 54 { // below half of the smallest subnormal
		return sign
	}
	// A carry to 0x400 is the smallest normal, whose bit pattern is exactly that.
	return sign | uint16(roundShift(m, s))
}

// roundShift returns m >> s rounded to nearest, ties to even (1 <= s <= 63).
func roundShift(m uint64, s uint) uint64 {
	keep := m >> s
	rem := m & (1<<s - 1)
	half := uint64(1) << (s - 1)
	if rem > half || rem == half && keep&1 == 1 {
		keep++
	}
	return keep
}

// EncodeFloat32 narrows src into dst; len(dst) must be at least len(src).
func EncodeFloat32(dst []uint16, src []float32) {
	var simd func(*uint16, *float32, int)
	if hasF16C {
		simd = encodeF16C
	}
	bulk.Convert(dst, src, 8, simd, FromFloat32)
}

// DecodeFloat32 widens src into dst; len(dst) must be at least len(src).
func DecodeFloat32(dst []float32, src []uint16) {
	var simd func(*float32, *uint16, int)
	if hasF16C {
		simd = decodeF16C
	}
	bulk.Convert(dst, src, 8, simd, ToFloat32)
}

// EncodeFloat64 narrows src into dst with a single rounding; len(dst) must be at least len(src).
func EncodeFloat64(dst []uint16, src []float64) { bulk.Convert(dst, src, 1, nil, FromFloat64) }

// DecodeFloat64 widens src into dst; len(dst) must be at least len(src).
func DecodeFloat64(dst []float64, src []uint16) { bulk.Convert(dst, src, 1, nil, ToFloat64) }

// Accelerated reports whether the bulk float32 conversions use the F16C instructions.
func Accelerated() bool { return hasF16C }
