package horovod

import (
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"
)

// With DeferAverage the Reducer returns sums and GradientScale the factor that makes them
// Average's results: exact to the bit once the product is rounded to the dtype, whatever the
// size (1/3 is inexact), the predivide factor and the backward passes. Each rank runs the same
// gradients through an Average reducer and a deferred one; the deferred results are also
// checked against the sum computed here, so that they are sums and not averages.
func TestReducerDeferredAverageScaleIsExact(t *testing.T) {
	for _, size := range []int{1, 2, 3} {
		for _, o := range []ReducerOptions{
			{},
			{InPlace: true},
			{GradientPredivideFactor: 3},
			{BackwardPassesPerStep: 2},
			{BackwardPassesPerStep: 3, AverageAggregatedGradients: true, GradientPredivideFactor: 2, InPlace: true},
		} {
			name := fmt.Sprintf("size=%d/predivide=%v/passes=%d/average_aggregated=%v/in_place=%v",
				size, o.GradientPredivideFactor, o.BackwardPassesPerStep, o.AverageAggregatedGradients, o.InPlace)
			t.Run(name, func(t *testing.T) {
				hs, _ := job(t, size)
				onEveryRank(t, hs, func(h *Horovod) error { return checkDeferredAverage(t, h, o) })
			})
		}
	}
}

// deferredGrads is one backward pass's gradients of rank on pass: a float32 and a float64
// tensor of values no fraction of which is exact in binary.
func deferredGrads(t *testing.T, rank, pass int) []NamedTensor {
	rng := rand.New(rand.NewPCG(uint64(rank), uint64(pass)))
	f32 := make([]float32, 257)
	for i := range f32 {
		f32[i] = float32(rng.NormFloat64() * math.Pow(10, float64(rng.IntN(7)-3)))
	}
	f64 := make([]float64, 31)
	for i := range f64 {
		f64[i] = rng.NormFloat64()
	}
	return []NamedTensor{{"w", mustTensor(t, []int{257}, f32)}, {"b", mustTensor(t, []int{31}, f64)}}
}

func checkDeferredAverage(t *testing.T, h *Horovod, o ReducerOptions) error {
	averaged, err := h.NewReducer(o)
	if err != nil {
		return err
	}
	d := o
	d.DeferAverage, d.Prefix = true, "deferred/"
	deferred, err := h.NewReducer(d)
	if err != nil {
		return err
	}
	passes, pre := max(1, o.BackwardPassesPerStep), 1.0
	if o.GradientPredivideFactor != 0 {
		pre = 1 / o.GradientPredivideFactor
	}
	if f, want := deferred.GradientScale(), max(1, o.GradientPredivideFactor)/float64(h.Size()); f != want || averaged.GradientScale() != 1 {
		return fmt.Errorf("GradientScale %v deferred, %v averaged; want %v and 1", f, averaged.GradientScale(), want)
	}
	for pass := range passes {
		avgOut, ready, err := averaged.Reduce(deferredGrads(t, h.Rank(), pass))
		if err != nil {
			return err
		}
		defOut, deferredReady, err := deferred.Reduce(deferredGrads(t, h.Rank(), pass))
		if err != nil {
			return err
		}
		if last := pass == passes-1; ready != last || deferredReady != last {
			return fmt.Errorf("pass %d of %d: ready %v averaged, %v deferred", pass+1, passes, ready, deferredReady)
		}
		if !ready {
			continue
		}
		f := deferred.GradientScale()
		w, dw := mustValues[float32](avgOut[0].Tensor), mustValues[float32](defOut[0].Tensor)
		b, db := mustValues[float64](avgOut[1].Tensor), mustValues[float64](defOut[1].Tensor)
		for i := range w {
			if got := float32(float64(dw[i]) * f); got != w[i] {
				return fmt.Errorf("w[%d]: deferred %v x %v = %v, Average %v", i, dw[i], f, got, w[i])
			}
		}
		for i := range b {
			if got := db[i] * f; got != b[i] {
				return fmt.Errorf("b[%d]: deferred %v x %v = %v, Average %v", i, db[i], f, got, b[i])
			}
		}
		// The deferred results are the sums over ranks and passes (each pass divided by the
		// passes with AverageAggregatedGradients, each rank's part by the predivide factor).
		local := 1.0
		if o.AverageAggregatedGradients {
			local = 1 / float64(passes)
		}
		for i, got := range dw {
			want := 0.0
			for r := range h.Size() {
				for p := range passes {
					want += float64(mustValues[float32](deferredGrads(t, r, p)[0].Tensor)[i]) * local * pre
				}
			}
			if math.Abs(float64(got)-want) > 1e-5*math.Abs(want)+1e-9 {
				return fmt.Errorf("w[%d]: deferred %v, want the sum %v", i, got, want)
			}
		}
	}
	return nil
}

// Compression divides while it widens the 16-bit sums, at no extra pass: DeferAverage leaves
// that path as it is, and GradientScale says 1.
func TestReducerDeferAverageWithCompressionIsAverage(t *testing.T) {
	for _, c := range []Compression{FP16Compression, BF16Compression} {
		t.Run(c.String(), func(t *testing.T) { testDeferAverageWithCompression(t, c) })
	}
}

func testDeferAverageWithCompression(t *testing.T, c Compression) {
	hs, _ := job(t, 3)
	onEveryRank(t, hs, func(h *Horovod) error {
		averaged, err := h.NewReducer(ReducerOptions{Compression: c, GradientPredivideFactor: 2})
		if err != nil {
			return err
		}
		deferred, err := h.NewReducer(ReducerOptions{Compression: c, GradientPredivideFactor: 2, DeferAverage: true, Prefix: "deferred/"})
		if err != nil {
			return err
		}
		if f := deferred.GradientScale(); f != 1 {
			return fmt.Errorf("GradientScale %v with %v compression, want 1", f, c)
		}
		a, _, err := averaged.Reduce(deferredGrads(t, h.Rank(), 0))
		if err != nil {
			return err
		}
		d, _, err := deferred.Reduce(deferredGrads(t, h.Rank(), 0))
		if err != nil {
			return err
		}
		if !slices.Equal(mustValues[float32](a[0].Tensor), mustValues[float32](d[0].Tensor)) ||
			!slices.Equal(mustValues[float64](a[1].Tensor), mustValues[float64](d[1].Tensor)) {
			return fmt.Errorf("%v with DeferAverage differs from %v Average", c, c)
		}
		return nil
	})
	if _, err := hs[0].NewReducer(ReducerOptions{Op: Sum, DeferAverage: true}); err == nil {
		t.Error("DeferAverage with Sum accepted")
	}
	for _, f := range []float64{-2, math.Inf(1), math.NaN()} {
		if _, err := hs[0].NewReducer(ReducerOptions{GradientPredivideFactor: f}); err == nil || !strings.Contains(err.Error(), "want a positive finite number") {
			t.Errorf("predivide factor %v: %v", f, err)
		}
	}
}

// BF16Compression averages within bfloat16's precision, where values beyond float16's 65504
// survive (FP16Compression makes them infinities), and really goes through bfloat16: its error
// exceeds what float16 would have made on ordinary values. bfloat16 keeps 8 significant bits:
// rounding errs by at most 2^-8 of the value. Each rank's part is rounded once, the loopback
// backend's sum (in float64) once, and the division happens in float32 while widening.
func TestReducerBF16CompressionKeepsFloat32Range(t *testing.T) {
	const size = 3
	grads := func(rank int) []float32 {
		rng := rand.New(rand.NewPCG(uint64(rank), 99))
		v := make([]float32, 1000)
		for i := range v {
			v[i] = float32(rng.NormFloat64() * math.Pow(10, float64(rng.IntN(8)-6)))
		}
		v[0], v[1], v[2] = 1e5*float32(rank+1), -7e4, 3e37 // beyond float16's range; the rest below 100
		return v
	}
	hs, _ := job(t, size)
	onEveryRank(t, hs, func(h *Horovod) error {
		results := map[Compression][]float32{}
		for _, c := range []Compression{NoCompression, FP16Compression, BF16Compression} {
			red, err := h.NewReducer(ReducerOptions{Compression: c, Prefix: c.String() + "/"})
			if err != nil {
				return err
			}
			out, _, err := red.Reduce([]NamedTensor{{"w", mustTensor(t, []int{1000}, grads(h.Rank()))}})
			if err != nil {
				return err
			}
			results[c] = slices.Clone(mustValues[float32](out[0].Tensor))
		}
		bf, fp := results[BF16Compression], results[FP16Compression]
		beyondFP16 := 0
		for i, got := range bf {
			want, magnitude := 0.0, 0.0
			for r := range size {
				want += float64(grads(r)[i]) / size
				magnitude += math.Abs(float64(grads(r)[i])) / size
			}
			if bound := 0x1p-8*(magnitude+math.Abs(want)) + 1e-30; math.Abs(float64(got)-want) > bound {
				return fmt.Errorf("w[%d]: bf16 average %v, want %v within %v", i, got, want, bound)
			}
			if math.Abs(want) > 65504 && math.IsInf(float64(fp[i]), 0) {
				beyondFP16++
			}
		}
		if beyondFP16 != 3 {
			return fmt.Errorf("%d of the 3 values beyond 65504 became infinities with fp16 compression: %v", beyondFP16, fp[:3])
		}
		// float16 keeps 11 significant bits: on ordinary values its error stays under 2^-11 of
		// the magnitude; bfloat16's somewhere exceeds it.
		coarser := false
		for i := 3; i < len(bf); i++ {
			ref := float64(results[NoCompression][i])
			coarser = coarser || math.Abs(float64(bf[i])-ref) > 0x1p-11*math.Abs(ref)
		}
		if !coarser {
			return fmt.Errorf("bf16 results within float16's precision everywhere: not rounded to bfloat16")
		}
		return nil
	})
}

// A later backward pass must have the first pass's gradients of the same step: one left over
// from an earlier step (whose accumulator the Reducer still holds) is an error, not summed into
// that stale accumulator while this step's gradient misses a pass; the error starts a new step.
func TestReducerPassesAreCheckedAgainstThisStepsFirst(t *testing.T) {
	hs, _ := job(t, 2)
	onEveryRank(t, hs, func(h *Horovod) error {
		r, err := h.NewReducer(ReducerOptions{BackwardPassesPerStep: 2, Op: Sum})
		if err != nil {
			return err
		}
		one := func(name string) NamedTensor { return NamedTensor{name, mustTensor(t, []int{1}, []float32{1})} }
		pass := func(names ...string) (bool, error) {
			var grads []NamedTensor
			for _, n := range names {
				grads = append(grads, one(n))
			}
			_, ready, err := r.Reduce(grads)
			return ready, err
		}
		for _, names := range [][]string{{"a", "b"}, {"a", "b"}, {"a", "c"}} {
			if _, err := pass(names...); err != nil {
				return err
			}
		}
		ready, err := pass("a", "b")
		if err == nil || ready || !strings.Contains(err.Error(), `gradient "b" appears in backward pass 2 but not in the first pass of the step`) {
			return fmt.Errorf("step 2's passes {a c}, {a b}: ready %v, %v", ready, err)
		}
		// The error dropped the step's passes: the next two calls are a new step's.
		for i, want := range []bool{false, true} {
			if ready, err := pass("a", "b"); err != nil || ready != want {
				return fmt.Errorf("pass %d after the error: ready %v, %v; want %v", i+1, ready, err, want)
			}
		}
		return nil
	})
}

// With InPlace and several backward passes the results are the Reducer's accumulators; given
// back in another order as the next step's first pass, each still sums as itself.
func TestReducerAccumulatorsGivenBackInAnotherOrder(t *testing.T) {
	hs, _ := job(t, 2)
	onEveryRank(t, hs, func(h *Horovod) error {
		r, err := h.NewReducer(ReducerOptions{BackwardPassesPerStep: 2, Op: Sum, InPlace: true})
		if err != nil {
			return err
		}
		val := func(x float32) Tensor { return mustTensor(t, []int{1}, []float32{x}) }
		if _, _, err := r.Reduce([]NamedTensor{{"a", val(1)}, {"b", val(10)}}); err != nil {
			return err
		}
		out, ready, err := r.Reduce([]NamedTensor{{"a", val(1)}, {"b", val(10)}})
		if err != nil || !ready {
			return fmt.Errorf("step 1: ready %v, %v", ready, err)
		}
		a, b := mustValues[float32](out[0].Tensor)[0], mustValues[float32](out[1].Tensor)[0]
		if a != 4 || b != 40 {
			return fmt.Errorf("step 1: a %v, b %v; want 4, 40", a, b)
		}
		// Step 2: a is given b's result (40), b a's (4), then a pass of zeros.
		if _, _, err := r.Reduce([]NamedTensor{{"a", out[1].Tensor}, {"b", out[0].Tensor}}); err != nil {
			return err
		}
		out, ready, err = r.Reduce([]NamedTensor{{"a", val(0)}, {"b", val(0)}})
		if err != nil || !ready {
			return fmt.Errorf("step 2: ready %v, %v", ready, err)
		}
		if a, b := mustValues[float32](out[0].Tensor)[0], mustValues[float32](out[1].Tensor)[0]; a != 80 || b != 8 {
			return fmt.Errorf("step 2 with the results swapped: a %v, b %v; want 80, 8", a, b)
		}
		return nil
	})
}

// A step's results handed back to the next step in another order, as its inputs, each sum as
// themselves when the tensors do not fuse (each over half the fusion threshold): the responses
// then run one after another, and the first would write its result over the second's input if
// the step's results went where the last step's lie (inputsInResults).
func TestReducerResultsGivenBackInAnotherOrderUnfused(t *testing.T) {
	const n = 64
	hs, _ := job(t, 2, WithFusionThreshold(n*4+4))
	onEveryRank(t, hs, func(h *Horovod) error {
		r, err := h.NewReducer(ReducerOptions{Op: Sum})
		if err != nil {
			return err
		}
		fill := func(x float32) Tensor {
			v := make([]float32, n)
			for i := range v {
				v[i] = x
			}
			return mustTensor(t, []int{n}, v)
		}
		out, _, err := r.Reduce([]NamedTensor{{"a", fill(1)}, {"b", fill(10)}})
		if err != nil {
			return err
		}
		// a is given b's result (20 everywhere), b a's (2): same sizes, so each input lies in
		// the other's result slot.
		out, _, err = r.Reduce([]NamedTensor{{"a", out[1].Tensor}, {"b", out[0].Tensor}})
		if err != nil {
			return err
		}
		for i, want := range []float32{40, 4} {
			for k, got := range mustValues[float32](out[i].Tensor) {
				if got != want {
					return fmt.Errorf("step 2 with the results swapped: %s[%d] = %v, want %v", out[i].Name, k, got, want)
				}
			}
		}
		return nil
	})
}
