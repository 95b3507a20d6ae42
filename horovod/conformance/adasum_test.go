package conformance

import (
	"fmt"
	"math"
	"testing"

	"github.com/gorovod/gorovod/horovod"
	"github.com/gorovod/gorovod/horovod/backend"
)

// Adasum between processes, checked by what its formula makes exact: gradients orthogonal
// across ranks (each rank's nonzero elements where the others' are zero) have no dot product,
// every coefficient is 1, and the result is their sum; gradients parallel across ranks, rank r's
// s_r times one vector, combine pairwise into (s_a+s_b)/2 times it, so the result is that mean
// taken up the tree of ranks (scales per tensor, powers of two: every coefficient, product and
// sum exact in every float dtype). Tensors fused in one group, of lengths that shards cut. Every
// rank gets the same bytes, also for gradients that differ freely.
func TestAdasum(t *testing.T) {
	size, rank := hvd.Size(), hvd.Rank()
	empty, err := hvd.Allreduce("adasum/empty", tensor(backend.Float32, []int{0}, nil), horovod.AllreduceOptions{Op: horovod.Adasum})
	if err != nil || len(empty.Data) != 0 {
		t.Fatalf("an empty Adasum: %d bytes, %v", len(empty.Data), err)
	}
	lengths := []int{1, 7, 1000}
	for _, dt := range []backend.DType{backend.Float32, backend.Float64, backend.Float16, backend.BFloat16} {
		for _, c := range []struct {
			name  string
			input func(r, k, i int) float64
			want  func(k, i int) float64
		}{
			{"orthogonal", func(r, k, i int) float64 {
				if i%size != r {
					return 0
				}
				return float64((r+1)*(i%5+1) + k)
			}, func(k, i int) float64 { return float64((i%size+1)*(i%5+1) + k) }},
			{"parallel", func(r, k, i int) float64 { return adasumScale(r, k) * float64(i%7-3) }, func(k, i int) float64 {
				scales := make([]float64, size)
				for r := range scales {
					scales[r] = adasumScale(r, k)
				}
				return treeMean(scales) * float64(i%7-3)
			}},
			{"free", func(r, k, i int) float64 { return math.Round(8*math.Sin(float64(r*1000+k*100+i))) / 8 }, nil},
		} {
			name := fmt.Sprintf("adasum/%v/%s", dt, c.name)
			var named []horovod.NamedTensor
			for k, n := range lengths {
				vals := make([]float64, n)
				for i := range vals {
					vals[i] = c.input(rank, k, i)
				}
				named = append(named, horovod.NamedTensor{Name: fmt.Sprintf("%s/%d", name, k), Tensor: tensor(dt, []int{n}, vals)})
			}
			got, err := hvd.GroupedAllreduce(named, horovod.AllreduceOptions{Op: horovod.Adasum})
			if err != nil {
				t.Fatalf("%s: %v", name, err)
			}
			for k, n := range lengths {
				if c.want != nil {
					want := make([]float64, n)
					for i := range want {
						want[i] = c.want(k, i)
					}
					expectValues(t, fmt.Sprintf("%s tensor %d", name, k), got[k], dt, []int{n}, want)
				}
				sameOnEveryRank(t, fmt.Sprintf("same/%s/%d", name, k), string(got[k].Data))
			}
		}
	}
}

// adasumScale is rank r's scale of tensor k in TestAdasum's parallel gradients: 1, 2 or 4.
func adasumScale(r, k int) float64 { return float64(int(1) << ((r + k) % 3)) }

// treeMean is the mean of scales taken pairwise up Adasum's tree of ranks, written as a
// recursion: the first power-of-two ranks at least half of them, then the rest.
func treeMean(scales []float64) float64 {
	if len(scales) == 1 {
		return scales[0]
	}
	half := 1
	for half*2 < len(scales) {
		half *= 2
	}
	return (treeMean(scales[:half]) + treeMean(scales[half:])) / 2
}
