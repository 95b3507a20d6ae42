package bf16

import (
	"bytes"
	"encoding/binary"
	"math"
	"math/big"
	"math/rand/v2"
	"os/exec"
	"testing"

	"github.com/gorovod/gorovod/horovod/internal/bulk/bulktest"
	"github.com/gorovod/gorovod/tf/testenv"
)

// paths runs f once per implementation the machine has: the portable loop, and AVX2 when present.
func paths(t *testing.T, f func(t *testing.T)) { bulktest.Paths(t, &hasAVX2, "avx2", f) }

// exact is the value of a bfloat16 computed from its definition, independently of ToFloat32.
func exact(b uint16) float64 { return bulktest.Exact(b, 8, 7) }

func TestEveryBFloat16DecodesExactly(t *testing.T) { paths(t, testEveryBFloat16DecodesExactly) }

func testEveryBFloat16DecodesExactly(t *testing.T) {
	all := make([]uint16, 1<<16)
	for i := range all {
		all[i] = uint16(i)
	}
	bulk := make([]float32, len(all))
	DecodeFloat32(bulk, all)
	bulk64 := make([]float64, len(all))
	DecodeFloat64(bulk64, all)
	for i, b := range all {
		want := exact(b)
		if math.IsNaN(want) {
			if got := bulk[i]; got == got || !math.IsNaN(bulk64[i]) {
				t.Fatalf("bfloat16 %#04x is NaN; decoded %v / %v", b, got, bulk64[i])
			}
			continue
		}
		if float64(bulk[i]) != want || math.Signbit(float64(bulk[i])) != math.Signbit(want) || bulk64[i] != want {
			t.Fatalf("bfloat16 %#04x decoded to %v / %v, want %v", b, bulk[i], bulk64[i], want)
		}
	}
}

// edgeFloats are where rounding goes wrong first: zeros, infinities, NaNs (signalling too, and
// with a payload only in the bits that are dropped), the largest bfloat16 and the tie above it,
// values beyond float16's 65504, float32 subnormals and the subnormal/normal boundary, and every
// tie between adjacent bfloat16s near 1 and near the smallest normal, with a neighbour either side.
func edgeFloats() []float32 {
	bits := []uint32{
		0, 0x7f800000, 0x7fc00000, 0x7f800001, 0x7fbfffff, 0x7fffffff, 0x7f812345,
		0x7f7f0000, 0x7f7f7fff, 0x7f7f8000, 0x7f7f8001, 0x7f7fffff, 0x7f7e8000,
		0x477fe000, 0x47800000, 0x47c35000, 0x4b800000, // 65504, 65536, 100000, 2^24
		0x00000001, 0x00008000, 0x00018000, 0x00007fff, 0x00008001, 0x007fffff, 0x007f8000, 0x00800000,
		0x3f800000, 0x3f808000, 0x3f818000, 0x3f807fff, 0x3f808001, 0x3fffffff,
	}
	var out []float32
	for _, b := range bits {
		out = append(out, math.Float32frombits(b), math.Float32frombits(b|0x80000000))
	}
	for _, base := range []uint32{0x3f800000, 0x00800000, 0x00000000, 0x7f000000} {
		for k := uint32(0); k < 256; k++ {
			mid := base + k<<16 + 0x8000
			out = append(out, math.Float32frombits(mid), math.Float32frombits(mid-1), math.Float32frombits(mid+1))
		}
	}
	return out
}

// mlDtypes converts float32 bytes to bfloat16 with ml_dtypes (the bfloat16 of JAX and of
// TensorFlow's Python, from the project virtualenv): an independent reference.
func mlDtypes(t *testing.T, in []float32) []uint16 {
	t.Helper()
	raw := make([]byte, 4*len(in))
	for i, f := range in {
		binary.LittleEndian.PutUint32(raw[4*i:], math.Float32bits(f))
	}
	cmd := exec.Command(testenv.VenvPython.Require(t), "-c", "import sys, numpy as np, ml_dtypes\n"+
		"sys.stdout.buffer.write(np.frombuffer(sys.stdin.buffer.read(), '<f4').astype(ml_dtypes.bfloat16).view('<u2').tobytes())")
	cmd.Stdin = bytes.NewReader(raw)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("ml_dtypes: %v\n%s", err, stderr.String())
	}
	ref := make([]uint16, len(in))
	for i := range ref {
		ref[i] = binary.LittleEndian.Uint16(out[2*i:])
	}
	return ref
}

func TestEncodingMatchesMLDtypes(t *testing.T) { paths(t, testEncodingMatchesMLDtypes) }

func testEncodingMatchesMLDtypes(t *testing.T) {
	r := rand.New(rand.NewPCG(3, 4))
	in := append(edgeFloats(), make([]float32, 1<<18)...)
	for i := len(in) - 1<<18; i < len(in); i++ {
		in[i] = math.Float32frombits(r.Uint32())
	}
	ref := mlDtypes(t, in)
	got := make([]uint16, len(in))
	EncodeFloat32(got, in)
	// A slice of odd length at an odd offset: the bulk path's tail and unaligned loads.
	odd := make([]uint16, len(in)-4)
	EncodeFloat32(odd, in[1:len(in)-3])
	for i := range odd {
		if odd[i] != got[i+1] {
			t.Fatalf("element %d of an offset slice encoded to %#04x, %#04x in the whole", i+1, odd[i], got[i+1])
		}
	}
	for i, f := range in {
		want := ref[i]
		if f != f {
			// ml_dtypes (Eigen) returns a canonical NaN; VCVTNEPS2BF16 and we keep the payload's top
			// bits. Both must be a NaN of the same sign.
			if got[i]&0x7f80 != 0x7f80 || got[i]&0x7f == 0 || got[i]&0x8000 != want&0x8000 || got[i]&0x40 == 0 {
				t.Fatalf("NaN %#08x encoded to %#04x, ml_dtypes %#04x", math.Float32bits(f), got[i], want)
			}
			continue
		}
		if got[i] != want || FromFloat32(f) != want {
			t.Fatalf("%v (%#08x) encoded to %#04x, ml_dtypes says %#04x", f, math.Float32bits(f), got[i], want)
		}
	}
}

// nearest64 is the bfloat16 nearest to the finite f, ties to even, found with big.Float over the
// neighbours of f's truncation: independent of the round-to-odd path FromFloat64 takes.
func nearest64(f float64) uint16 {
	bf := func(b uint16) *big.Float { return new(big.Float).SetFloat64(exact(b)) }
	x := new(big.Float).SetFloat64(f)
	sign := uint16(0)
	if f < 0 {
		sign = 0x8000
		x.Neg(x)
	}
	// The largest finite bfloat16 not above |f| (0x7f7f at most), then compare the distances to
	// it and to the next one (the next of 0x7f7f being infinity, whose "distance" is that of the
	// value it would have with one more binade).
	lo := uint16(0)
	for step := uint16(1 << 14); step > 0; step >>= 1 {
		if c := lo + step; c <= 0x7f7f && bf(c).Cmp(x) <= 0 {
			lo = c
		}
	}
	hiVal := new(big.Float).SetMantExp(big.NewFloat(1), 128)
	if lo < 0x7f7f {
		hiVal = bf(lo + 1)
	}
	dLo := new(big.Float).Sub(x, bf(lo))
	dHi := new(big.Float).Sub(hiVal, x)
	switch c := dLo.Cmp(dHi); {
	case c < 0, c == 0 && lo&1 == 0:
		return sign | lo
	}
	return sign | (lo + 1) // 0x7f80 is infinity
}

func TestFloat64RoundsOnce(t *testing.T) {
	r := rand.New(rand.NewPCG(5, 6))
	var in []float64
	// Just above and below ties of bfloat16s, where rounding through float32 first would tie
	// falsely, and random values over and beyond float32's range.
	for _, b := range []uint16{0x3f80, 0x0001, 0x0080, 0x7f7e, 0x7f7f, 0x4780} {
		mid := (exact(b) + exact(b+1)) / 2
		if b == 0x7f7f {
			mid = exact(b) * (1 + 1.0/512)
		}
		in = append(in, mid, mid+mid*0x1p-40, mid-mid*0x1p-40, math.Nextafter(mid, 0), math.Nextafter(mid, math.Inf(1)))
	}
	in = append(in, 0x1p-150, 0x1p-134, 0x1p-134*1.0000001, 1e300, math.SmallestNonzeroFloat64)
	for range 1 << 16 {
		in = append(in, math.Ldexp(r.Float64()+0.5, r.IntN(290)-150))
	}
	for _, f := range append(in, negate(in)...) {
		if got, want := FromFloat64(f), nearest64(f); got != want {
			t.Fatalf("%v (%#016x) encoded to %#04x, want %#04x", f, math.Float64bits(f), got, want)
		}
	}
	for _, f := range []float64{math.NaN(), math.Inf(1), math.Inf(-1)} {
		if got, want := ToFloat64(FromFloat64(f)), f; !(got == want || got != got && want != want) {
			t.Fatalf("%v round-tripped to %v", f, got)
		}
	}
}

func negate(in []float64) []float64 {
	out := make([]float64, len(in))
	for i, f := range in {
		out[i] = -f
	}
	return out
}
