// Package bulktest holds what the tests of the 16-bit float formats (fp16, bf16) share: running a
// test once per conversion path the CPU has, and a format's values computed from its definition.
package bulktest

import (
	"math"
	"testing"
)

// Paths runs f with the portable loop (*simd set to false) and, when *simd was true on entry
// (the CPU has the instructions), again with the SIMD path called name; *simd is restored when
// the test ends.
func Paths(t *testing.T, simd *bool, name string, f func(t *testing.T)) {
	saved := *simd
	t.Cleanup(func() { *simd = saved })
	*simd = false
	t.Run("portable", f)
	if saved {
		*simd = true
		t.Run(name, f)
	} else {
		t.Logf("no %s on this CPU: only the portable path ran", name)
	}
}

// Exact is the value of the 16-bit float bits whose exponent has expBits bits and whose
// mantissa has manBits (IEEE binary16: 5 and 10; bfloat16: 8 and 7), computed from the format's
// definition, independently of the conversions under test.
func Exact(bits uint16, expBits, manBits int) float64 {
	sign := 1.0
	if bits&0x8000 != 0 {
		sign = -1
	}
	maxExp := 1<<expBits - 1
	bias := maxExp >> 1
	exp := int(bits>>manBits) & maxExp
	man := float64(bits & (1<<manBits - 1))
	switch exp {
	case maxExp:
		if man != 0 {
			return math.NaN()
		}
		return math.Inf(int(sign))
	case 0:
		return sign * math.Ldexp(man, 1-bias-manBits)
	}
	return sign * math.Ldexp(float64(int(1)<<manBits)+man, exp-bias-manBits)
}
