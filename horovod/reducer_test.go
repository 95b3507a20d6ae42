package horovod

import (
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
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

// FP16Compression divides while it widens the float16 sums, at no extra pass: DeferAverage
// leaves that path as it is, and GradientScale says 1.
func TestReducerDeferAverageWithFP16IsAverage(t *testing.T) {
	hs, _ := job(t, 3)
	onEveryRank(t, hs, func(h *Horovod) error {
		averaged, err := h.NewReducer(ReducerOptions{Compression: FP16Compression, GradientPredivideFactor: 2})
		if err != nil {
			return err
		}
		deferred, err := h.NewReducer(ReducerOptions{Compression: FP16Compression, GradientPredivideFactor: 2, DeferAverage: true, Prefix: "deferred/"})
		if err != nil {
			return err
		}
		if f := deferred.GradientScale(); f != 1 {
			return fmt.Errorf("GradientScale %v with fp16 compression, want 1", f)
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
			return fmt.Errorf("fp16 with DeferAverage differs from fp16 Average")
		}
		return nil
	})
	if _, err := hs[0].NewReducer(ReducerOptions{Op: Sum, DeferAverage: true}); err == nil {
		t.Error("DeferAverage with Sum accepted")
	}
}
