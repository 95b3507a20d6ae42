package fp16

import (
	"math"
	"math/rand/v2"
	"slices"
	"testing"
)

// TestParallelMatchesSerial converts an odd-sized slice, large enough for parallel.For to split
// it (pieces of at least a megabyte), with several worker counts: the halves and the widened
// values must be those of the serial conversion bit for bit, nothing may be written past the
// end, and the specials (NaN payloads, infinities, overflow, subnormals, signed zeros) must
// come through each piece boundary as they do serially.
func TestParallelMatchesSerial(t *testing.T) {
	const n = 3<<20 + 5
	r := rand.New(rand.NewPCG(5, 6))
	specials := []float64{math.NaN(), math.Inf(1), math.Inf(-1), 7e4, -65520, 65504, 6e-8, -3e-8, 1e-300, 0, math.Copysign(0, -1)}
	wide := make([]float64, n)
	for i := range wide {
		if i%97 == 0 {
			wide[i] = specials[i/97%len(specials)]
		} else {
			wide[i] = r.NormFloat64() * math.Exp2(float64(r.IntN(40)-25))
		}
	}
	narrow := make([]float32, n)
	for i, f := range wide {
		narrow[i] = float32(f)
	}
	bits32 := func(v []float32) []uint32 {
		b := make([]uint32, len(v))
		for i, f := range v {
			b[i] = math.Float32bits(f)
		}
		return b
	}
	bits64 := func(v []float64) []uint64 {
		b := make([]uint64, len(v))
		for i, f := range v {
			b[i] = math.Float64bits(f)
		}
		return b
	}
	paths(t, func(t *testing.T) {
		want16, want64 := make([]uint16, n), make([]uint16, n)
		EncodeFloat32(want16, narrow)
		EncodeFloat64(want64, wide)
		back32, back64 := make([]float32, n), make([]float64, n)
		DecodeFloat32(back32, want16)
		DecodeFloat64(back64, want64)
		for _, workers := range []int{1, 2, 3, 8} {
			h := make([]uint16, n+1)
			h[n] = 0xbeef
			EncodeFloat32Parallel(h, narrow, workers)
			if h[n] != 0xbeef || !slices.Equal(h[:n], want16) {
				t.Fatalf("workers=%d: EncodeFloat32Parallel differs from EncodeFloat32", workers)
			}
			f := make([]float32, n+1)
			DecodeFloat32Parallel(f, want16, workers)
			if f[n] != 0 || !slices.Equal(bits32(f[:n]), bits32(back32)) {
				t.Fatalf("workers=%d: DecodeFloat32Parallel differs from DecodeFloat32", workers)
			}
			h[n] = 0xbeef
			EncodeFloat64Parallel(h, wide, workers)
			if h[n] != 0xbeef || !slices.Equal(h[:n], want64) {
				t.Fatalf("workers=%d: EncodeFloat64Parallel differs from EncodeFloat64", workers)
			}
			d := make([]float64, n+1)
			DecodeFloat64Parallel(d, want64, workers)
			if d[n] != 0 || !slices.Equal(bits64(d[:n]), bits64(back64)) {
				t.Fatalf("workers=%d: DecodeFloat64Parallel differs from DecodeFloat64", workers)
			}
		}
	})
}
