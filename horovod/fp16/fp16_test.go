package fp16

import (
	"math"
	"math/rand/v2"
	"testing"

	"github.com/gorovod/gorovod/horovod/internal/bulk/bulktest"

	"github.com/x448/float16"
)

// paths runs f once per implementation the machine has: the portable loop, and F16C when present.
func paths(t *testing.T, f func(t *testing.T)) { bulktest.Paths(t, &hasF16C, "f16c", f) }

// exactHalf is the value of a half computed from its definition, independently of ToFloat32.
func exactHalf(b uint16) float64 { return bulktest.Exact(b, 5, 10) }

func TestEveryHalfDecodesExactly(t *testing.T) {
	paths(t, func(t *testing.T) {
		src := make([]uint16, 1<<16)
		for i := range src {
			src[i] = uint16(i)
		}
		bulk := make([]float32, len(src))
		DecodeFloat32(bulk, src)
		bulk64 := make([]float64, len(src))
		DecodeFloat64(bulk64, src)
		for i, h := range src {
			want := exactHalf(h)
			got := ToFloat32(h)
			if math.IsNaN(want) {
				if !isNaN32(got) || !isNaN32(bulk[i]) || !math.IsNaN(bulk64[i]) {
					t.Fatalf("half %#04x is NaN; decoded %v (bulk %v)", h, got, bulk[i])
				}
				// Quiet NaN, sign and payload kept, as F16C and x448/float16 do.
				wantBits := uint32(h&0x8000)<<16 | 0x7fc00000 | uint32(h&0x3ff)<<13
				if math.Float32bits(got) != wantBits || math.Float32bits(bulk[i]) != wantBits {
					t.Fatalf("half %#04x: NaN bits %#08x (bulk %#08x), want %#08x", h, math.Float32bits(got), math.Float32bits(bulk[i]), wantBits)
				}
				continue
			}
			if float64(got) != want || math.Signbit(float64(got)) != math.Signbit(want) {
				t.Fatalf("half %#04x decoded to %v, want %v", h, got, want)
			}
			if math.Float32bits(bulk[i]) != math.Float32bits(got) || bulk64[i] != want {
				t.Fatalf("half %#04x: bulk decode %v / %v, scalar %v", h, bulk[i], bulk64[i], got)
			}
			if ref := float16.Frombits(h).Float32(); math.Float32bits(ref) != math.Float32bits(got) {
				t.Fatalf("half %#04x: %v, x448/float16 says %v", h, got, ref)
			}
		}
	})
}

func isNaN32(f float32) bool { return f != f }

// edgeFloats are the values where rounding goes wrong first: the limits of each range, ties, and
// their neighbours.
func edgeFloats() []float32 {
	bits := []uint32{
		0, 0x80000000, 0x7f800000, 0xff800000, // zeros, infinities
		0x7fc00000, 0xffc00000, 0x7f800001, 0x7fbfffff, 0x7fffffff, 0xff812345, // NaNs, signalling too
		0x477fe000, 0x477fefff, 0x477ff000, 0x477ff001, 0x47800000, 0x7f7fffff, // max half, overflow tie, beyond
		0x38800000, 0x387fffff, 0x387fe000, 0x387ff000, // smallest normal half and below
		0x33800000, 0x33000000, 0x33000001, 0x32ffffff, 0x33c00000, 0x33400000, // smallest subnormal, ties to 0 and 1
		0x00000001, 0x007fffff, 0x00800000, // float32 subnormals
		0x3f800000, 0x3f801000, 0x3f802000, 0x3f803000, 0x3f801001, 0x3f800fff, // 1 and ties around it
		0x3a000000, 0x39ffe000, 0x3a001000, // subnormal/normal boundary neighbourhood
	}
	var out []float32
	for _, b := range bits {
		out = append(out, math.Float32frombits(b), math.Float32frombits(b|0x80000000))
	}
	// Every midpoint between adjacent finite halves, and one ulp either side.
	for h := uint16(0); h < 0x7bff; h++ {
		mid := (exactHalf(h) + exactHalf(h+1)) / 2
		m := float32(mid)
		out = append(out, m, math.Nextafter32(m, 0), math.Nextafter32(m, 1e9))
	}
	return out
}

func checkEncoding(t *testing.T, in []float32) {
	t.Helper()
	bulk := make([]uint16, len(in))
	EncodeFloat32(bulk, in)
	for i, f := range in {
		got := FromFloat32(f)
		want := float16.Fromfloat32(f).Bits()
		if isNaN32(f) {
			// x448/float16 keeps signalling NaNs signalling; F16C and we quiet them (setting 0x200).
			want |= 0x200
		}
		if got != want || bulk[i] != want {
			t.Fatalf("%v (%#08x) encoded to %#04x (bulk %#04x), want %#04x", f, math.Float32bits(f), got, bulk[i], want)
		}
	}
}

func TestEncodingMatchesReference(t *testing.T) {
	paths(t, func(t *testing.T) {
		t.Run("edges", func(t *testing.T) { checkEncoding(t, edgeFloats()) })
		t.Run("random bits", func(t *testing.T) {
			r := rand.New(rand.NewPCG(1, 2))
			in := make([]float32, 1<<20)
			for i := range in {
				in[i] = math.Float32frombits(r.Uint32())
			}
			checkEncoding(t, in)
		})
		t.Run("random in range", func(t *testing.T) {
			r := rand.New(rand.NewPCG(3, 4))
			in := make([]float32, 1<<20)
			for i := range in {
				in[i] = float32(r.NormFloat64() * math.Exp2(float64(r.IntN(40)-26)))
			}
			checkEncoding(t, in)
		})
		t.Run("every 4099th float32", func(t *testing.T) {
			in := make([]float32, 0, 1<<32/4099+1)
			for b := uint64(0); b < 1<<32; b += 4099 {
				in = append(in, math.Float32frombits(uint32(b)))
			}
			checkEncoding(t, in)
		})
	})
}

// nearestHalf finds the half nearest to f by search over every finite half, ties to even: a
// reference for float64 inputs, which no library here narrows directly.
func nearestHalf(f float64) uint16 {
	if math.IsInf(f, 0) || math.Abs(f) >= 65520 {
		if f < 0 {
			return 0xfc00
		}
		return 0x7c00
	}
	best, bestErr := uint16(0), math.Inf(1)
	for h := uint16(0); h <= 0x7bff; h++ {
		e := math.Abs(exactHalf(h) - math.Abs(f))
		if e < bestErr || e == bestErr && h&1 == 0 {
			best, bestErr = h, e
		}
	}
	if math.Signbit(f) {
		best |= 0x8000
	}
	return best
}

func TestFloat64RoundsOnce(t *testing.T) {
	// Just above a midpoint between halves, by less than float32 can represent: narrowing through
	// float32 would round to the midpoint first and then to even, the wrong way.
	var in []float64
	for _, h := range []uint16{0x0001, 0x03ff, 0x0400, 0x3c00, 0x3c01, 0x7000, 0x7bfe} {
		mid := (exactHalf(h) + exactHalf(h+1)) / 2
		in = append(in, mid, mid*(1+1e-12), mid*(1-1e-12), -mid*(1+1e-12))
	}
	r := rand.New(rand.NewPCG(5, 6))
	for range 300 {
		in = append(in, r.NormFloat64()*math.Exp2(float64(r.IntN(36)-25)))
	}
	in = append(in, 65519.99, 65520, 1e300, -1e300, 5e-324, math.Ldexp(1, -25), math.Ldexp(1.0000001, -25))
	out := make([]uint16, len(in))
	EncodeFloat64(out, in)
	for i, f := range in {
		if want := nearestHalf(f); out[i] != want || FromFloat64(f) != want {
			t.Fatalf("%v encoded to %#04x, nearest half is %#04x", f, out[i], want)
		}
	}
	// NaNs quieted, sign and top payload bits kept, as float32's are (checkEncoding): a
	// signalling NaN whose payload lies below half's ten bits would otherwise become infinity.
	for _, c := range []struct {
		bits uint64
		want uint16
	}{
		{0x7ff8000000000000, 0x7e00}, // quiet
		{0x7ff0000000000001, 0x7e00}, // signalling, payload only in the low bits
		{0xfff0000000000001, 0xfe00},
		{0x7ff4000000000000, 0x7f00}, // signalling, top payload bit kept
	} {
		if h := FromFloat64(math.Float64frombits(c.bits)); h != c.want {
			t.Fatalf("NaN %#016x encoded to %#04x, want %#04x", c.bits, h, c.want)
		}
	}
}

func TestBulkHandlesEveryLength(t *testing.T) {
	paths(t, func(t *testing.T) {
		r := rand.New(rand.NewPCG(7, 8))
		for n := 0; n <= 80; n++ {
			src := make([]float32, n)
			for i := range src {
				src[i] = float32(r.NormFloat64() * 100)
			}
			// One spare element each side: the bulk routines must not write past n.
			halves := make([]uint16, n+1)
			halves[n] = 0xbeef
			EncodeFloat32(halves, src)
			back := make([]float32, n+1)
			back[n] = 42
			DecodeFloat32(back, halves[:n])
			if halves[n] != 0xbeef || back[n] != 42 {
				t.Fatalf("n=%d: wrote past the end", n)
			}
			for i := range src {
				if halves[i] != FromFloat32(src[i]) || back[i] != ToFloat32(halves[i]) {
					t.Fatalf("n=%d i=%d: bulk and scalar disagree", n, i)
				}
			}
		}
	})
}
