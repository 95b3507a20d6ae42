package horovod

import (
	"math"
	"slices"

	"github.com/gorovod/gorovod/horovod/backend"
)

// Adasum's combination of two ranks' tensors a and b is a*(1-dot/(2|a|²)) + b*(1-dot/(2|b|²)),
// dot = a·b, per tensor; a coefficient stays 1 where its tensor's squared norm is below
// adasumNormFloor (a rank that contributes zeros, a joined one, leaves the other's tensor as is).
// Combinations follow a binary tree over the ranks: at level 1 ranks 0 and 1, 2 and 3, ...; at
// level 2 the combinations of 0-1 and 2-3, ...; which is the order of Horovod's recursive vector
// halving on a power-of-two job. A block of ranks without a partner at some level (a job of 3, 5,
// ...) goes up the tree as it is; Horovod refuses such jobs.
const adasumNormFloor = 1e-8

// adasumFloats are the dtypes Adasum combines, as Horovod's (float16, float32, float64) and
// bfloat16.
func adasumFloats(dt DType) bool {
	return dt == Float16 || dt == BFloat16 || dt == Float32 || dt == Float64
}

// adasum combines every rank's in, the tensors of tensorBytes back to back, of dtype dt, with
// Adasum, into out on every rank (out may be in).
//
// Rank j combines shard j of the elements of every rank, so that each rank computes and moves
// a share of the data rather than all of it: an all-to-all gives rank j every rank's shard j;
// at each level of the tree the ranks add up each tensor's dot product and squared norms over
// their shards with one small allreduce, and combine their shards of each pair; an allgather of
// the combined shards gives every rank the whole result. In bytes moved per rank that is a ring
// allreduce's; the sums are of float64 partial sums, so a result differs from a one-pass
// computation by rounding only.
func (c *controller) adasum(in, out []byte, tensorBytes []int, dt DType) error {
	size, es := c.size, dt.Size()
	n := len(in) / es
	shard := make([]int, size+1) // rank j's shard is bytes shard[j]..shard[j+1] of every rank's in
	for j := range shard {
		shard[j] = j * n / size * es
	}
	counts := make([]int, size)
	for j := range counts {
		counts[j] = shard[j+1] - shard[j]
	}
	lo, mine := shard[c.rank], counts[c.rank]
	c.adasumBuf = slices.Grow(c.adasumBuf[:0], size*mine)[:size*mine]
	blocks := make([][]byte, size) // every rank's shard c.rank, in rank order
	for k := range blocks {
		blocks[k] = c.adasumBuf[k*mine : (k+1)*mine]
	}
	if a, ok := c.data.(backend.Alltoaller); ok && len(in) <= math.MaxInt32 && size*mine <= math.MaxInt32 {
		if err := a.Alltoallv(in, counts, c.adasumBuf, slices.Repeat([]int{mine}, size)); err != nil {
			return err
		}
	} else {
		// Every rank's whole input, of which this rank keeps its shard of each.
		all := make([]byte, size*len(in))
		if err := c.data.Allgatherv(in, all, slices.Repeat([]int{len(in)}, size)); err != nil {
			return err
		}
		for k, b := range blocks {
			copy(b, all[k*len(in)+lo:])
		}
	}
	segs := tensorSegments(tensorBytes, lo, mine)
	tensors := len(tensorBytes)
	for level := 1; level < size; level *= 2 {
		var lefts []int // the first rank of each pair's left block
		for left := 0; left+level < size; left += 2 * level {
			lefts = append(lefts, left)
		}
		// Per pair and tensor: a·b, |a|², |b|², summed over the shards of every rank.
		wire := make([]byte, len(lefts)*tensors*3*8)
		sums := view[float64](wire)
		for p, left := range lefts {
			for _, s := range segs {
				dot, aa, bb := adasumDots(dt, blocks[left][s.from:s.to], blocks[left+level][s.from:s.to])
				at := (p*tensors + s.tensor) * 3
				sums[at] += dot
				sums[at+1] += aa
				sums[at+2] += bb
			}
		}
		if err := c.data.Allreduce(wire, wire, backend.Float64, backend.Sum); err != nil {
			return err
		}
		for p, left := range lefts {
			for _, s := range segs {
				at := (p*tensors + s.tensor) * 3
				dot, aa, bb := sums[at], sums[at+1], sums[at+2]
				ca, cb := 1.0, 1.0
				if aa >= adasumNormFloor {
					ca = 1 - dot/aa*0.5
				}
				if bb >= adasumNormFloor {
					cb = 1 - dot/bb*0.5
				}
				adasumCombine(dt, blocks[left][s.from:s.to], blocks[left+level][s.from:s.to], ca, cb)
			}
		}
	}
	return c.data.Allgatherv(blocks[0], out, counts)
}

// tensorSegment is the part of one tensor that lies in a rank's shard, in bytes from the shard's
// start.
type tensorSegment struct{ tensor, from, to int }

// tensorSegments splits the shard of mine bytes starting lo bytes into the tensors of
// tensorBytes (back to back) along the tensors' bounds; tensors outside the shard have none.
func tensorSegments(tensorBytes []int, lo, mine int) []tensorSegment {
	var segs []tensorSegment
	start := 0
	for t, n := range tensorBytes {
		from, to := max(start, lo), min(start+n, lo+mine)
		if from < to {
			segs = append(segs, tensorSegment{t, from - lo, to - lo})
		}
		start += n
	}
	return segs
}

// adasumDots returns a·b, |a|² and |b|², of two parts of one tensor, accumulated in float64.
func adasumDots(dt DType, a, b []byte) (dot, aa, bb float64) {
	switch dt {
	case Float32:
		return dotsFloat32(view[float32](a), view[float32](b))
	case Float64:
		x, y := view[float64](a), view[float64](b)
		i := simdPrefix(len(x), 8, func(n int) { dot, aa, bb = adasumDotsFloat64AVX(&x[0], &y[0], n) })
		for ; i < len(x); i++ {
			dot += x[i] * y[i]
			aa += x[i] * x[i]
			bb += y[i] * y[i]
		}
	default: // Float16, BFloat16: widened to float32 block by block
		codec, _ := codecOf(dt)
		var bx, by [halfBlock]float32
		x, y := view[uint16](a), view[uint16](b)
		for off := 0; off < len(x); off += halfBlock {
			end := min(off+halfBlock, len(x))
			u, v := bx[:end-off], by[:end-off]
			codec.decode32(u, x[off:end])
			codec.decode32(v, y[off:end])
			d, p, q := dotsFloat32(u, v)
			dot, aa, bb = dot+d, aa+p, bb+q
		}
	}
	return dot, aa, bb
}

// dotsFloat32 is adasumDots of float32s: widened to float64, eight lanes at a time with AVX.
func dotsFloat32(x, y []float32) (dot, aa, bb float64) {
	i := simdPrefix(len(x), 8, func(n int) { dot, aa, bb = adasumDotsFloat32AVX(&x[0], &y[0], n) })
	for ; i < len(x); i++ {
		u, v := float64(x[i]), float64(y[i])
		dot += u * v
		aa += u * u
		bb += v * v
	}
	return dot, aa, bb
}

// adasumCombine sets a to ca*a + cb*b, computed in float64 and rounded once; the 16-bit types
// are widened to float32 block by block, combined as float32s, and rounded back.
func adasumCombine(dt DType, a, b []byte, ca, cb float64) {
	switch dt {
	case Float32:
		combineFloat32(view[float32](a), view[float32](b), ca, cb)
	case Float64:
		x, y := view[float64](a), view[float64](b)
		i := simdPrefix(len(x), 4, func(n int) { adasumCombineFloat64AVX(&x[0], &y[0], n, ca, cb) })
		for ; i < len(x); i++ {
			x[i] = ca*x[i] + cb*y[i]
		}
	default:
		codec, _ := codecOf(dt)
		codec.mapHalves(view[uint16](a), view[uint16](b), func(x, y []float32) { combineFloat32(x, y, ca, cb) })
	}
}

// combineFloat32 is adasumCombine of float32s, four lanes at a time with AVX.
func combineFloat32(x, y []float32, ca, cb float64) {
	i := simdPrefix(len(x), 4, func(n int) { adasumCombineFloat32AVX(&x[0], &y[0], n, ca, cb) })
	for ; i < len(x); i++ {
		x[i] = float32(ca*float64(x[i]) + cb*float64(y[i]))
	}
}
