// Package bf16 converts between bfloat16 ("brain float": float32's sign and 8-bit exponent, 7
// stored mantissa bits) and float32/float64, one value at a time or in bulk. Narrowing rounds to
// nearest, ties to even; bfloat16 has float32's range, so nothing finite in float32 overflows
// except what rounds past the largest bfloat16 (about 3.39e38), subnormals stay subnormals, and
// NaNs stay NaNs (quieted, with the sign and the top payload bits kept, as x86's VCVTNEPS2BF16
// does). On x86-64 CPUs with AVX2 the bulk float32 conversions run eight lanes at a time in
// assembly (integer arithmetic: no bfloat16 instructions needed); elsewhere a portable loop gives
// bit-identical results.
//
// Values are carried as their bit patterns in uint16, which is what crosses the wire in
// horovod's bf16 compression and what TensorFlow's DT_BFLOAT16 tensors hold.
package bf16

import (
	"math"

	"github.com/gorovod/gorovod/horovod/internal/bulk"
)

// ToFloat32 widens a bfloat16 to float32 exactly: its bits are float32's top half.
func ToFloat32(b uint16) float32 { return math.Float32frombits(uint32(b) << 16) }

// ToFloat64 widens a bfloat16 to float64 exactly.
func ToFloat64(b uint16) float64 { return float64(ToFloat32(b)) }

// FromFloat32 narrows f to the nearest bfloat16, ties to even.
func FromFloat32(f float32) uint16 {
	b := math.Float32bits(f)
	if b&0x7fffffff > 0x7f800000 { // NaN: truncating could leave an infinity's pattern
		return uint16(b>>16) | 0x40
	}
	// Adding 0x7fff rounds up what lies above the midpoint; the kept bit's own value breaks
	// the tie toward even. A carry out of the mantissa moves to the next binade, or to infinity,
	// which is the right rounding in both cases.
	return uint16((b + 0x7fff + b>>16&1) >> 16)
}

// FromFloat64 narrows f to the nearest bfloat16, ties to even, with a single rounding: f is first
// rounded to float32 toward odd (truncated, with the lowest bit set when anything was lost),
// which keeps 16 more bits than bfloat16's and so can never create a false tie.
func FromFloat64(f float64) uint16 {
	t := float32(f)
	if float64(t) != f && f == f {
		if math.Abs(float64(t)) > math.Abs(f) { // rounded away from zero: step back
			t = math.Nextafter32(t, 0)
		}
		t = math.Float32frombits(math.Float32bits(t) | 1)
	}
	return FromFloat32(t)
}

// EncodeFloat32 narrows src into dst; len(dst) must be at least len(src).
func EncodeFloat32(dst []uint16, src []float32) {
	var simd func(*uint16, *float32, int)
	if hasAVX2 {
		simd = encodeAVX2
	}
	bulk.Convert(dst, src, 8, simd, FromFloat32)
}

// DecodeFloat32 widens src into dst; len(dst) must be at least len(src).
func DecodeFloat32(dst []float32, src []uint16) {
	var simd func(*float32, *uint16, int)
	if hasAVX2 {
		simd = decodeAVX2
	}
	bulk.Convert(dst, src, 8, simd, ToFloat32)
}

// EncodeFloat64 narrows src into dst with a single rounding; len(dst) must be at least len(src).
func EncodeFloat64(dst []uint16, src []float64) { bulk.Convert(dst, src, 1, nil, FromFloat64) }

// DecodeFloat64 widens src into dst; len(dst) must be at least len(src).
func DecodeFloat64(dst []float64, src []uint16) { bulk.Convert(dst, src, 1, nil, ToFloat64) }

// Accelerated reports whether the bulk float32 conversions use AVX2.
func Accelerated() bool { return hasAVX2 }
