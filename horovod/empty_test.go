package horovod

import (
	"fmt"
	"testing"
)

// A tensor with a zero dimension is a valid gradient (an unused embedding slice, a [0,4] bias
// of a pruned layer): compression, scaling and the Reducer treat its empty buffer as a no-op
// instead of indexing into it.
func TestEmptyTensorsAreNoOps(t *testing.T) {
	for _, dt := range []DType{Float32, Float64} {
		compress([]conversion{{dt: dt, wide: []byte{}}}, 4)
		decompress([]conversion{{dt: dt, wide: []byte{}}}, 0.5, 4)
		scale([]byte{}, dt, 1.0/3, 4)
	}
	hs, _ := job(t, 2)
	onEveryRank(t, hs, func(h *Horovod) error {
		for _, o := range []ReducerOptions{
			{Compression: FP16Compression},
			{Compression: FP16Compression, InPlace: true},
			{Compression: FP16Compression, DeferAverage: true},
			{Prefix: "plain/"},
		} {
			r, err := h.NewReducer(o)
			if err != nil {
				return err
			}
			x := float32(h.Rank() + 1)
			grads := []NamedTensor{
				{Name: "w", Tensor: mustTensor(t, []int{2}, []float32{x, 2 * x})},
				{Name: "empty32", Tensor: mustTensor(t, []int{0, 4}, []float32{})},
				{Name: "empty64", Tensor: mustTensor(t, []int{4, 0}, []float64{})},
				{Name: "v", Tensor: mustTensor(t, []int{1}, []float64{3 * float64(x)})},
			}
			out, ready, err := r.Reduce(grads)
			if err != nil {
				return fmt.Errorf("%+v: %w", o, err)
			}
			if !ready || len(out) != 4 {
				return fmt.Errorf("%+v: ready=%v, %d outputs", o, ready, len(out))
			}
			k := 1.0
			if o.DeferAverage {
				k = r.GradientScale()
			}
			// Mean over ranks of x = 1, 2 is 1.5.
			if w := mustValues[float32](out[0].Tensor); float64(w[0])*k != 1.5 || float64(w[1])*k != 3 {
				return fmt.Errorf("%+v: w = %v (scale %v), want [1.5 3]", o, w, k)
			}
			if v := mustValues[float64](out[3].Tensor); v[0]*k != 4.5 {
				return fmt.Errorf("%+v: v = %v (scale %v), want [4.5]", o, v, k)
			}
			for i, want := range [][]int{{0, 4}, {4, 0}} {
				e := out[1+i].Tensor
				if fmt.Sprint(e.Shape) != fmt.Sprint(want) || len(e.Data) != 0 || e.DType != grads[1+i].DType {
					return fmt.Errorf("%+v: %s = %v %v (%d bytes), want empty %v", o, out[1+i].Name, e.DType, e.Shape, len(e.Data), want)
				}
			}
		}
		// Allreduce and Allgather of an empty tensor with scaling.
		got, err := h.Allreduce("e", mustTensor(t, []int{0}, []float32{}), AllreduceOptions{Prescale: 2, Postscale: 0.5})
		if err != nil || len(got.Data) != 0 {
			return fmt.Errorf("empty allreduce: %v %v", got.Shape, err)
		}
		return nil
	})
}
