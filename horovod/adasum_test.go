package horovod

import (
	"bytes"
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"

	"github.com/gorovod/gorovod/horovod/bf16"
	"github.com/gorovod/gorovod/horovod/fp16"
)

// adasumReference combines vs (one vector per rank) as the paper's recursion does, written
// independently of horovod's level-by-level shards: a job splits into its first power-of-two
// ranks at least half of it and the rest, each half combined the same way, then the two halves
// by Adasum's formula, in float64, over whole vectors.
func adasumReference(vs [][]float64) []float64 {
	if len(vs) == 1 {
		return slices.Clone(vs[0])
	}
	half := 1
	for half*2 < len(vs) {
		half *= 2
	}
	a, b := adasumReference(vs[:half]), adasumReference(vs[half:])
	var dot, aa, bb float64
	for i := range a {
		dot += a[i] * b[i]
		aa += a[i] * a[i]
		bb += b[i] * b[i]
	}
	ca, cb := 1.0, 1.0
	if aa >= 1e-8 {
		ca = 1 - dot/(2*aa)
	}
	if bb >= 1e-8 {
		cb = 1 - dot/(2*bb)
	}
	out := make([]float64, len(a))
	for i := range out {
		out[i] = ca*a[i] + cb*b[i]
	}
	return out
}

// floatTensor encodes v as a tensor of dt (rounding to it) and decodes it back, so that the
// reference starts from the values the ranks send.
func floatTensor(t *testing.T, dt DType, v []float64) (Tensor, []float64) {
	t.Helper()
	var x Tensor
	switch dt {
	case Float64:
		x = mustTensor(t, nil, slices.Clone(v))
	case Float32:
		f := make([]float32, len(v))
		for i := range v {
			f[i] = float32(v[i])
		}
		x = mustTensor(t, nil, f)
	case Float16, BFloat16:
		h := make([]uint16, len(v))
		if dt == Float16 {
			fp16.EncodeFloat64(h, v)
		} else {
			bf16.EncodeFloat64(h, v)
		}
		x = Tensor{DType: dt, Shape: []int{len(v)}, Data: make([]byte, 2*len(v))}
		copy(view[uint16](x.Data), h)
	}
	return x, floatValues(dt, x.Data)
}

// floatValues decodes a float tensor's data.
func floatValues(dt DType, data []byte) []float64 {
	out := make([]float64, len(data)/dt.Size())
	switch dt {
	case Float64:
		copy(out, view[float64](data))
	case Float32:
		for i, f := range view[float32](data) {
			out[i] = float64(f)
		}
	case Float16:
		fp16.DecodeFloat64(out, view[uint16](data))
	case BFloat16:
		bf16.DecodeFloat64(out, view[uint16](data))
	}
	return out
}

// An Adasum allreduce gives every rank the same bytes (each combined shard is computed once and
// gathered, so this holds whatever the CPU), equal within the dtype's rounding to the paper's
// recursion over whole vectors: jobs of 1 to 5 ranks (Horovod's power-of-two ones, and the
// others, whose blocks without a partner go up the tree as they are), tensors of one group
// fused (coefficients per tensor, shards cutting tensors, tensors smaller than the job), a rank
// contributing zeros, an empty tensor, the scale factors, with the backend's all-to-all and without.
func TestAdasum(t *testing.T) {
	lengths := []int{1, 37, 2, 300, 0}
	for _, size := range []int{1, 2, 3, 4, 5} {
		for _, native := range []bool{true, false} {
			hs, _, _, alltoalls := exchangeJob(t, size, native)
			for _, dt := range []DType{Float32, Float64, Float16, BFloat16} {
				for _, o := range []AllreduceOptions{{Op: Adasum}, {Op: Adasum, Prescale: 0.5, Postscale: 3}} {
					name := fmt.Sprintf("adasum/%d/%v/%v/%v", size, native, dt, o.Prescale)
					sent := make([][][]float64, size) // by rank, tensor
					named := make([][]NamedTensor, size)
					rng := rand.New(rand.NewPCG(uint64(size), uint64(dt)))
					for r := range size {
						for k, n := range lengths {
							v := make([]float64, n)
							for i := range v {
								if !(r == 0 && k == 2 || r == 1 && k == 3) { // zeros: a left and a right one
									v[i] = rng.NormFloat64() + float64(k)
								}
							}
							x, got := floatTensor(t, dt, v)
							named[r] = append(named[r], NamedTensor{Name: fmt.Sprintf("%s/%d", name, k), Tensor: x})
							sent[r] = append(sent[r], got)
						}
					}
					before := alltoalls.Load()
					results := make([][]Tensor, size)
					onEveryRank(t, hs, func(h *Horovod) (err error) {
						results[h.Rank()], err = h.GroupedAllreduce(named[h.Rank()], o)
						return err
					})
					if t.Failed() {
						t.FailNow()
					}
					if n := alltoalls.Load() - before; native != (n > 0) {
						t.Errorf("%s: %d calls of the backend's all-to-all", name, n)
					}
					pre, post := o.factors()
					tol := map[DType]float64{Float64: 1e-12, Float32: 1e-5, Float16: 2e-2, BFloat16: 1e-1}[dt]
					for k := range lengths {
						vs := make([][]float64, size)
						for r := range size {
							vs[r] = slices.Clone(sent[r][k])
							for i := range vs[r] {
								vs[r][i] *= pre
							}
						}
						want := adasumReference(vs)
						for r := range size {
							if !bytes.Equal(results[r][k].Data, results[0][k].Data) {
								t.Errorf("%s: tensor %d: rank %d's result differs from rank 0's", name, k, r)
							}
						}
						got := floatValues(dt, results[0][k].Data)
						for i := range want {
							if w := want[i] * post; !(math.Abs(got[i]-w) <= tol*(1+math.Abs(w))) { // NaN fails
								t.Errorf("%s: tensor %d element %d: %v, want %v", name, k, i, got[i], w)
								break
							}
						}
					}
				}
			}
		}
	}
}

// Adasum is refused, on the calling rank, for what it does not combine; an empty tensor alone
// (no element in any shard) is combined into an empty result.
func TestAdasumErrors(t *testing.T) {
	hs, _ := job(t, 2)
	onEveryRank(t, hs, func(h *Horovod) error {
		got, err := h.Allreduce("empty", mustTensor(t, []int{0, 3}, []float32{}), AllreduceOptions{Op: Adasum})
		if err != nil || len(got.Data) != 0 || !slices.Equal(got.Shape, []int{0, 3}) {
			return fmt.Errorf("rank %d: an empty Adasum: %v%v, %v", h.Rank(), got.DType, got.Shape, err)
		}
		return nil
	})
	h := hs[0]
	if _, err := h.Allreduce("i", mustTensor(t, nil, []int32{1}), AllreduceOptions{Op: Adasum}); err == nil ||
		!strings.Contains(err.Error(), "Adasum combines float16, bfloat16, float32 and float64 tensors, not int32") {
		t.Errorf("an int32 Adasum: %v", err)
	}
	if _, err := h.Allreduce("u", mustTensor(t, nil, []float32{1}), AllreduceOptions{Op: Adasum + 1}); err == nil || !strings.Contains(err.Error(), "unknown reduce op") {
		t.Errorf("an op past Adasum: %v", err)
	}
}

// A Reducer with Adasum combines the gradients as an Adasum allreduce does; with fp16
// compression, in float16 on the wire, widened back.
func TestReducerAdasum(t *testing.T) {
	hs, _ := job(t, 3)
	grads := func(rank int) []NamedTensor {
		var out []NamedTensor
		for k, n := range []int{5, 40} {
			v := make([]float32, n)
			for i := range v {
				v[i] = float32(math.Sin(float64(rank*100+k*10+i))) * 0.5
			}
			out = append(out, NamedTensor{Name: fmt.Sprint(k), Tensor: mustTensor(t, nil, v)})
		}
		return out
	}
	onEveryRank(t, hs, func(h *Horovod) error {
		want, err := h.GroupedAllreduce(grads(h.Rank()), AllreduceOptions{Op: Adasum})
		if err != nil {
			return err
		}
		for _, c := range []Compression{NoCompression, FP16Compression} {
			r, err := h.NewReducer(ReducerOptions{Op: Adasum, Compression: c})
			if err != nil {
				return err
			}
			got, _, err := r.Reduce(grads(h.Rank()))
			if err != nil {
				return err
			}
			// Uncompressed, the Reducer's allreduce is the same batch of the same bytes through
			// the same code in this process: bit for bit the grouped allreduce's.
			tol := map[Compression]float64{NoCompression: 0, FP16Compression: 2e-3}[c]
			for k := range got {
				g, _ := Values[float32](got[k].Tensor)
				w, _ := Values[float32](want[k])
				for i := range w {
					if !(math.Abs(float64(g[i]-w[i])) <= tol*(1+math.Abs(float64(w[i])))) {
						return fmt.Errorf("rank %d, %v: gradient %d element %d: %v, want %v", h.Rank(), c, k, i, g[i], w[i])
					}
				}
			}
		}
		return nil
	})
}

// A rank that has joined contributes zeros, which Adasum's norm floor passes over: the others'
// tensors combine among themselves (rank 2 joined: ranks 0 and 1 combine, as in a job of 2).
func TestAdasumWithJoin(t *testing.T) {
	for _, native := range []bool{true, false} {
		hs, _, _, _ := exchangeJob(t, 3, native)
		in := [][]float64{{1, 0}, {0, 2}} // orthogonal: the sum
		onEveryRank(t, hs, func(h *Horovod) error {
			if h.Rank() == 2 {
				_, err := h.Join()
				return err
			}
			out, err := h.Allreduce("adasum", mustTensor(t, nil, in[h.Rank()]), AllreduceOptions{Op: Adasum})
			if err != nil {
				return err
			}
			if got := mustValues[float64](out); !slices.Equal(got, []float64{1, 2}) {
				return fmt.Errorf("rank %d: %v, want [1 2]", h.Rank(), got)
			}
			_, err = h.Join()
			return err
		})
	}
}

// The AVX kernels of Adasum's float32 and float64 passes agree with the scalar loops: the
// combination bit for bit (per element the same float64 multiplications and addition, unfused,
// one rounding: no CPU or lane count changes that), the sums within float64 rounding (added in
// another order).
func TestAdasumKernels(t *testing.T) {
	if !hasAVX {
		t.Skip("no AVX on this CPU: the scalar loops alone run")
	}
	rng := rand.New(rand.NewPCG(1, 2))
	for _, c := range []struct {
		dt DType
		n  int
	}{{Float32, 1}, {Float32, 7}, {Float32, 8}, {Float32, 9}, {Float32, 33}, {Float32, 1000},
		{Float64, 3}, {Float64, 8}, {Float64, 13}, {Float64, 1000}} {
		dt, n := c.dt, c.n
		xs, ys := make([]float64, n), make([]float64, n)
		for i := range xs {
			xs[i], ys[i] = rng.NormFloat64(), rng.NormFloat64()*3
		}
		x, _ := floatTensor(t, dt, xs)
		y, _ := floatTensor(t, dt, ys)
		a, b := x.Data, y.Data
		run := func(avx bool) (dots [3]float64, combined []byte) {
			defer func(was bool) { hasAVX = was }(hasAVX)
			hasAVX = avx
			dots[0], dots[1], dots[2] = adasumDots(dt, a, b)
			combined = bytes.Clone(a)
			adasumCombine(dt, combined, b, 0.75, -1.25)
			return dots, combined
		}
		simd, simdOut := run(true)
		scalar, scalarOut := run(false)
		for k := range simd {
			if !(math.Abs(simd[k]-scalar[k]) <= 1e-12*(1+math.Abs(scalar[k]))) {
				t.Errorf("%v n=%d: sum %d %v with AVX, %v without", dt, n, k, simd[k], scalar[k])
			}
		}
		if !bytes.Equal(simdOut, scalarOut) {
			t.Errorf("%v n=%d: the combination differs with AVX", dt, n)
		}
	}
}
