package horovod

import (
	"fmt"
	"testing"

	"github.com/gorovod/gorovod/horovod/internal/gradshapes"
	"github.com/gorovod/gorovod/horovod/internal/parallel"
	"github.com/gorovod/gorovod/horovod/local"
)

// miniLMGradients are the gradients of finetune's default model, all-MiniLM-L6-v2 with a
// two-label classifier head (22,713,986 float32, 91 MB), each allocated apart as a train
// step's fetches are, with random values of a gradient's magnitude.
func miniLMGradients() []NamedTensor {
	shapes := gradshapes.MiniLM()
	grads := make([]NamedTensor, len(shapes))
	for i, v := range gradshapes.Random(shapes, 3) {
		t, err := NewTensor(shapes[i], v)
		if err != nil {
			panic(err)
		}
		grads[i] = NamedTensor{Name: fmt.Sprintf("g%03d", i), Tensor: t}
	}
	return grads
}

// BenchmarkReducerStep times one Reducer step over MiniLM's gradients at size 1 on the local
// backend, whose allreduce moves nothing, so that only the host passes count: the copy into
// the result arena (plain), prescale and postscale (predivide), compression and widening (fp16),
// float16 prescaling and widening with a scale (fp16_predivide). Each runs with one goroutine
// per pass and with parallel.Workers(1), the Reducer's choice in a job of one process per
// machine, side by side in one run.
func BenchmarkReducerStep(b *testing.B) {
	grads := miniLMGradients()
	bytes := 0
	for _, g := range grads {
		bytes += len(g.Data)
	}
	h, err := Init(WithBackend(local.Backend{}))
	if err != nil {
		b.Fatal(err)
	}
	defer h.Shutdown()
	for _, c := range []struct {
		name string
		opts ReducerOptions
	}{
		{"plain", ReducerOptions{}},
		{"predivide", ReducerOptions{GradientPredivideFactor: 4}},
		{"fp16", ReducerOptions{Compression: FP16Compression}},
		{"bf16", ReducerOptions{Compression: BF16Compression}},
		{"fp16_predivide", ReducerOptions{Compression: FP16Compression, GradientPredivideFactor: 4}},
	} {
		for _, workers := range []int{1, parallel.Workers(1)} {
			b.Run(fmt.Sprintf("%s/workers=%d", c.name, workers), func(b *testing.B) {
				h.workers = workers
				r, err := h.NewReducer(c.opts)
				if err != nil {
					b.Fatal(err)
				}
				if _, _, err := r.Reduce(grads); err != nil { // allocates the arenas
					b.Fatal(err)
				}
				b.SetBytes(int64(bytes))
				for b.Loop() {
					if _, _, err := r.Reduce(grads); err != nil {
						b.Fatal(err)
					}
				}
			})
		}
	}
}

// BenchmarkScale times Average's pass over a 1 MiB result on one goroutine: float32 by a factor
// float32 holds (1/2, 2 ranks), by one it does not (1/3, 3 ranks), float64 by 1/2, each with the
// AVX kernels where the CPU has them and with the scalar loop (noAVX) side by side.
func BenchmarkScale(b *testing.B) {
	for _, c := range []struct {
		name string
		dt   DType
		f    float64
	}{{"float32_half", Float32, 0.5}, {"float32_third", Float32, 1.0 / 3}, {"float64_half", Float64, 0.5}} {
		for _, avx := range []bool{true, false} {
			name := c.name
			if !avx {
				name += "_noAVX"
			}
			b.Run(name, func(b *testing.B) {
				defer func(was bool) { hasAVX = was }(hasAVX)
				hasAVX = hasAVX && avx
				buf := make([]byte, 1<<20)
				b.SetBytes(int64(len(buf)))
				for b.Loop() {
					scale(buf, c.dt, c.f, 1)
				}
			})
		}
	}
}

// BenchmarkAdasumPass times an Adasum level's pass over one rank's shard on one goroutine: the
// dot product and squared norms of two 1 MiB tensors, then their combination, per dtype.
func BenchmarkAdasumPass(b *testing.B) {
	for _, dt := range []DType{Float32, Float64, BFloat16} {
		b.Run(dt.String(), func(b *testing.B) {
			x, y := make([]byte, 1<<20), make([]byte, 1<<20)
			b.SetBytes(int64(len(x)))
			for b.Loop() {
				dot, aa, bb := adasumDots(dt, x, y)
				adasumCombine(dt, x, y, 1-dot/(aa+1), 1-dot/(bb+1))
			}
		})
	}
}
