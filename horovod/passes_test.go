package horovod

import (
	"bytes"
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/gorovod/gorovod/horovod/bf16"
	"github.com/gorovod/gorovod/horovod/fp16"
)

// passElems is odd-sized and large enough that parallel.For splits a pass over it (pieces of
// at least a megabyte) into several pieces for every dtype, the last of them short.
const passElems = 3<<20 + 5

var passWorkers = []int{1, 2, 3, 8}

// randomBuffer holds n elements of dt: for float32 and float64 values of every magnitude with
// NaN, infinities, signed zeros and subnormals among them; for float16 and the integers random
// bit patterns (every half: NaNs, infinities, subnormals).
func randomBuffer(dt DType, n int, r *rand.Rand) []byte {
	specials := []float64{math.NaN(), math.Inf(1), math.Inf(-1), 0, math.Copysign(0, -1), 1e-40, -1e-310, 7e4, 1e30}
	wide := func(i int) float64 {
		if i%97 == 0 {
			return specials[i/97%len(specials)]
		}
		return r.NormFloat64() * math.Exp2(float64(r.IntN(60)-30))
	}
	buf := make([]byte, n*dt.Size())
	switch dt {
	case Float32:
		v := view[float32](buf)
		for i := range v {
			v[i] = float32(wide(i))
		}
	case Float64:
		v := view[float64](buf)
		for i := range v {
			v[i] = wide(i)
		}
	default:
		for i := range buf {
			buf[i] = byte(r.Uint32())
		}
	}
	return buf
}

// scaleReference is what scaling buf by f must give, element by element: one rounding of the
// product for float32 and float64, float32 arithmetic for float16, truncation toward zero for
// integers; a factor of 1 leaves every bit as it is (float16 NaNs unquieted, large int64s).
func scaleReference(buf []byte, dt DType, f float64) []byte {
	out := slices.Clone(buf)
	if f == 1 {
		return out
	}
	switch dt {
	case Float32:
		v := view[float32](out)
		for i := range v {
			v[i] = float32(float64(v[i]) * f)
		}
	case Float64:
		v := view[float64](out)
		for i := range v {
			v[i] *= f
		}
	case Float16:
		v := view[uint16](out)
		for i := range v {
			v[i] = fp16.FromFloat32(fp16.ToFloat32(v[i]) * float32(f))
		}
	case BFloat16:
		v := view[uint16](out)
		for i := range v {
			v[i] = bf16.FromFloat32(bf16.ToFloat32(v[i]) * float32(f))
		}
	case Int32:
		truncateReference(view[int32](out), f)
	case Int64:
		truncateReference(view[int64](out), f)
	case Int8:
		truncateReference(view[int8](out), f)
	case Uint8:
		truncateReference(view[uint8](out), f)
	}
	return out
}

func truncateReference[T int8 | uint8 | int32 | int64](v []T, f float64) {
	for i, x := range v {
		v[i] = T(math.Trunc(float64(x) * f))
	}
}

// passFactors are the factors each dtype is scaled by: one float32 holds exactly (the float32
// fast path), one it does not, a negative one. Integer factors stay within [-1, 1] so that every
// product fits the type (converting an out-of-range float is implementation-defined in Go).
func passFactors(dt DType) []float64 {
	if dt == Uint8 {
		return []float64{0.75, 1.0 / 3}
	}
	return []float64{0.75, 1.0 / 3, -0.7}
}

var passDTypes = []DType{Float32, Float64, Float16, BFloat16, Int32, Int64, Int8, Uint8}

// firstDifference names the first element where got and want differ, for the failure message.
func firstDifference(got, want []byte, size int) int {
	for i := 0; i < len(want); i += size {
		if !bytes.Equal(got[i:i+size], want[i:i+size]) {
			return i / size
		}
	}
	return -1
}

// TestScaleIsTheSameOverGoroutines scales odd-sized buffers of every dtype over 1, 2, 3 and 8
// goroutines: each result must equal the element-by-element reference byte for byte, the
// float16 blockwise path and the integer truncation included. Bit-exact because every element is
// one correctly rounded product of its own (no sum across elements whose order a split could
// change), and an IEEE product rounds the same in an AVX lane as in scalar code on any x86 CPU.
func TestScaleIsTheSameOverGoroutines(t *testing.T) {
	r := rand.New(rand.NewPCG(9, 10))
	for _, dt := range passDTypes {
		src := randomBuffer(dt, passElems, r)
		for _, f := range passFactors(dt) {
			want := scaleReference(src, dt, f)
			for _, workers := range passWorkers {
				got := slices.Clone(src)
				scale(got, dt, f, workers)
				if i := firstDifference(got, want, dt.Size()); i >= 0 {
					t.Errorf("%v x %v over %d goroutines: element %d differs from the reference", dt, f, workers, i)
				}
			}
		}
	}
}

// TestCompressionIsTheSameOverGoroutines narrows a step's worth of float32 and float64
// tensors of odd sizes (empty ones, dozens of small ones that share a goroutine's range, ones
// split over several, boundaries at every alignment) in one pass and widens the halves back with
// and without a factor, over 1, 2, 3 and 8 goroutines, in float16 and in bfloat16: each tensor's
// halves must be the serial conversion of that tensor alone, its widened values the serial
// widening scaled as scale does, byte for byte, and no byte past a tensor written. Bit-exact
// because each element converts on its own and the SIMD conversions are specified to agree bit for
// bit with the portable ones (fp16 and bf16 test that against references on every path).
func TestCompressionIsTheSameOverGoroutines(t *testing.T) {
	for _, c := range []Compression{FP16Compression, BF16Compression} {
		t.Run(c.String(), func(t *testing.T) { testCompressionOverGoroutines(t, c) })
	}
}

func testCompressionOverGoroutines(t *testing.T, comp Compression) {
	wireType, codec, _ := comp.wire()
	narrow32, widen32, narrow64, widen64 := fp16.FromFloat32, fp16.ToFloat32, fp16.FromFloat64, fp16.ToFloat64
	if wireType == BFloat16 {
		narrow32, widen32, narrow64, widen64 = bf16.FromFloat32, bf16.ToFloat32, bf16.FromFloat64, bf16.ToFloat64
	}
	r := rand.New(rand.NewPCG(11, 12))
	sizes := []int{3, 0, passElems, 700001}
	for i := range 60 {
		sizes = append(sizes, 1000+i*997)
	}
	sizes = append(sizes, 0, 1<<18+1)
	var srcs, halves, wides [][]byte // the inputs and the serial conversions, tensor by tensor
	var dts []DType
	for i, n := range sizes {
		dt := []DType{Float32, Float64}[i%2]
		src := randomBuffer(dt, n, r)
		half := make([]byte, 2*n)
		wide := make([]byte, len(src))
		h := view[uint16](half)
		for i := range n { // one element at a time: no bulk path in the reference
			switch dt {
			case Float32:
				h[i] = narrow32(view[float32](src)[i])
				view[float32](wide)[i] = widen32(h[i])
			case Float64:
				h[i] = narrow64(view[float64](src)[i])
				view[float64](wide)[i] = widen64(h[i])
			}
		}
		srcs, halves, wides, dts = append(srcs, src), append(halves, half), append(wides, wide), append(dts, dt)
	}
	// guarded is n bytes with a guard byte past them that must stay 0xAB.
	guarded := func(n int) []byte {
		b := make([]byte, n+1)
		b[n] = 0xAB
		return b[: n : n+1]
	}
	intact := func(b []byte) bool { return b[: len(b)+1 : len(b)+1][len(b)] == 0xAB }
	for _, workers := range passWorkers {
		convs := make([]conversion, len(sizes))
		for i := range sizes {
			convs[i] = conversion{dt: dts[i], codec: codec, wide: srcs[i], half: guarded(len(halves[i]))}
		}
		compress(convs, workers)
		for i, c := range convs {
			if k := firstDifference(c.half, halves[i], 2); k >= 0 || !intact(c.half) {
				t.Errorf("tensor %d (%v, %d elements) compressed over %d goroutines: half %d differs from the serial conversion, or a byte past it was written", i, dts[i], sizes[i], workers, k)
			}
		}
		for _, f := range append([]float64{1}, passFactors(Float32)...) {
			for i := range convs {
				convs[i] = conversion{dt: dts[i], codec: codec, wide: guarded(len(srcs[i])), half: halves[i]}
			}
			decompress(convs, f, workers)
			for i, c := range convs {
				want := scaleReference(wides[i], dts[i], f)
				if k := firstDifference(c.wide, want, dts[i].Size()); k >= 0 || !intact(c.wide) {
					t.Errorf("tensor %d (%v, %d elements) widened x %v over %d goroutines: element %d differs from the serial widening, or a byte past it was written", i, dts[i], sizes[i], f, workers, k)
				}
			}
		}
	}
}

// TestAccumulationIsTheSameOverGoroutines adds odd-sized buffers of every dtype over 1, 2, 3
// and 8 goroutines: the sums must equal the serial sum byte for byte, since each element is one
// correctly rounded addition of two values, whichever goroutine makes it.
func TestAccumulationIsTheSameOverGoroutines(t *testing.T) {
	r := rand.New(rand.NewPCG(15, 16))
	for _, dt := range passDTypes {
		a, b := randomBuffer(dt, passElems, r), randomBuffer(dt, passElems, r)
		want := slices.Clone(a)
		addRange(want, b, dt)
		for _, workers := range passWorkers {
			got := slices.Clone(a)
			addInto(got, b, dt, workers)
			if i := firstDifference(got, want, dt.Size()); i >= 0 {
				t.Errorf("%v over %d goroutines: element %d differs from the serial sum", dt, workers, i)
			}
		}
	}
}

// TestJobIsTheSameOverGoroutines runs the same two-rank job with one goroutine per pass and with
// four: Reducer steps on large and small gradients (fp16 with a predivide factor, the predivide alone, two backward passes
// accumulated and averaged), a grouped allreduce with prescale and postscale (the fusion
// buffer's copies in and out) and a single allreduce with a prescale, on tensors large enough to
// split. Each rank's results must be the same byte for byte: the goroutines split only passes
// whose elements are computed each on its own (the tests above), and the loopback backend sums
// the ranks' contributions in rank order whatever the split.
func TestJobIsTheSameOverGoroutines(t *testing.T) {
	run := func(workers int) [][]byte {
		hs, _ := job(t, 2)
		results := make([][]byte, len(hs))
		onEveryRank(t, hs, func(h *Horovod) error {
			h.workers = workers
			r := rand.New(rand.NewPCG(17, uint64(h.Rank())))
			var grads []NamedTensor
			for i, n := range []int{1<<20 + 3, 5, 700001} {
				grads = append(grads, NamedTensor{Name: fmt.Sprint("f32_", i), Tensor: Tensor{DType: Float32, Shape: []int{n}, Data: randomBuffer(Float32, n, r)}})
			}
			grads = append(grads, NamedTensor{Name: "f64", Tensor: Tensor{DType: Float64, Shape: []int{300001}, Data: randomBuffer(Float64, 300001, r)}})
			for i := range 30 { // small ones, which share a goroutine's range in the conversions
				n := 3000 + 77*i
				grads = append(grads, NamedTensor{Name: fmt.Sprint("small_", i), Tensor: Tensor{DType: Float32, Shape: []int{n}, Data: randomBuffer(Float32, n, r)}})
			}
			var out []byte
			for _, o := range []ReducerOptions{
				{Compression: FP16Compression, GradientPredivideFactor: 2},
				{GradientPredivideFactor: 2},
				{Compression: FP16Compression, BackwardPassesPerStep: 2, AverageAggregatedGradients: true},
			} {
				red, err := h.NewReducer(o)
				if err != nil {
					return err
				}
				for range max(1, o.BackwardPassesPerStep) {
					reduced, ready, err := red.Reduce(grads)
					if err != nil {
						return fmt.Errorf("%+v: %w", o, err)
					}
					for _, g := range reduced {
						out = append(out, g.Data...)
					}
					if ready != (len(reduced) > 0) {
						return fmt.Errorf("%+v: ready=%v with %d tensors", o, ready, len(reduced))
					}
				}
			}
			grouped, err := h.GroupedAllreduce(grads, AllreduceOptions{Op: Sum, Prescale: 0.3, Postscale: 1.7})
			if err != nil {
				return err
			}
			for _, g := range grouped {
				out = append(out, g.Data...)
			}
			single, err := h.Allreduce("single", grads[0].Tensor, AllreduceOptions{Prescale: 0.3})
			if err != nil {
				return err
			}
			results[h.Rank()] = append(out, single.Data...)
			return nil
		})
		return results
	}
	one, four := run(1), run(4)
	for rank := range one {
		if len(one[rank]) == 0 || !bytes.Equal(one[rank], four[rank]) {
			t.Errorf("rank %d: the results over four goroutines differ from those over one (%d and %d bytes)", rank, len(four[rank]), len(one[rank]))
		}
	}
}
