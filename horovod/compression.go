package horovod

import (
	"fmt"

	"github.com/gorovod/gorovod/horovod/internal/parallel"
)

// Compression is how a Reducer puts gradients on the wire (Horovod's Compression.none and
// Compression.fp16, and a bfloat16 analogue Horovod lacks).
type Compression uint8

const (
	// NoCompression sends tensors as they are.
	NoCompression Compression = iota
	// FP16Compression sends float32 and float64 tensors as float16, halving or quartering the
	// bytes moved; integer and 16-bit float tensors pass through unchanged. Values beyond ±65504
	// become infinities, so it suits gradients, not arbitrary data.
	FP16Compression
	// BF16Compression sends float32 and float64 tensors as bfloat16: the same bytes as
	// FP16Compression and float32's range (values beyond ±65504 survive) for 8 significant bits
	// instead of 11. Integer and 16-bit float tensors pass through unchanged.
	BF16Compression
)

func (c Compression) String() string {
	switch c {
	case NoCompression:
		return "none"
	case FP16Compression:
		return "fp16"
	case BF16Compression:
		return "bf16"
	}
	return fmt.Sprintf("Compression(%d)", uint8(c))
}

// ParseCompression is the Compression a name from String stands for.
func ParseCompression(name string) (Compression, error) {
	for c := NoCompression; c <= BF16Compression; c++ {
		if c.String() == name {
			return c, nil
		}
	}
	return 0, fmt.Errorf("horovod: unknown compression %q (none, fp16 or bf16)", name)
}

// wire is the 16-bit type c puts float32 and float64 tensors on the wire as; ok is false for
// NoCompression.
func (c Compression) wire() (dt DType, codec halfCodec, ok bool) {
	switch c {
	case FP16Compression:
		return Float16, float16Codec, true
	case BF16Compression:
		return BFloat16, bfloat16Codec, true
	}
	return 0, halfCodec{}, false
}

// compresses reports whether c changes the wire dtype of a tensor of type dt.
func (c Compression) compresses(dt DType) bool {
	_, _, ok := c.wire()
	return ok && (dt == Float32 || dt == Float64)
}

// conversion is one gradient's part in a step's compression: its float32 or float64 values
// and their 16-bit copy on the wire.
type conversion struct {
	dt         DType
	codec      halfCodec
	wide, half []byte
}

// convertAll runs convert on pieces of the conversions in one pass over up to workers
// goroutines whose ranges span tensors (parallel.ForParts): a step's many small gradients
// share goroutines instead of each being too small to split and running alone on the calling
// one. Elements [lo, hi) of conversion c are handed over together.
func convertAll(convs []conversion, workers int, convert func(c conversion, lo, hi int)) {
	lens := make([]int, len(convs))
	for i, c := range convs {
		lens[i] = len(c.half) / 2
	}
	// A piece's size is counted in float32s; passAlign keeps F16C's lanes whole within a tensor.
	parallel.ForParts(lens, 4, passAlign, workers, func(i, lo, hi int) { convert(convs[i], lo, hi) })
}

// compress narrows every conversion's values into its halves. Every element converts on its
// own (the assembly and the portable conversions agree bit for bit), so the result depends
// neither on workers nor on where the ranges fall.
func compress(convs []conversion, workers int) {
	convertAll(convs, workers, func(c conversion, lo, hi int) {
		h := view[uint16](c.half)[lo:hi]
		switch c.dt {
		case Float32:
			c.codec.encode32(h, view[float32](c.wide)[lo:hi])
		case Float64:
			c.codec.encode64(h, view[float64](c.wide)[lo:hi])
		}
	})
}

// widenBlock is how many elements decompress widens and then scales while they are in the
// second-level cache, instead of making a second pass over memory to scale: on a 16-core H200
// host, where one core's share of the memory bandwidth is small, that pass is much of the cost.
// Blocks of 2048 cost 9% on a 2-core machine where scaling, not memory, bounds a core; blocks of
// 8192 cost nothing there (measured).
const widenBlock = 8192

// decompress widens every conversion's halves back into its values and multiplies them by
// factor, so that averaging happens at full precision after the reduction. The result depends
// neither on workers nor on where the ranges fall.
func decompress(convs []conversion, factor float64, workers int) {
	convertAll(convs, workers, func(c conversion, lo, hi int) {
		size := c.dt.Size()
		h := view[uint16](c.half)
		for b := lo; b < hi; b += widenBlock {
			e := min(b+widenBlock, hi)
			part := c.wide[b*size : e*size]
			switch c.dt {
			case Float32:
				c.codec.decode32(view[float32](part), h[b:e])
			case Float64:
				c.codec.decode64(view[float64](part), h[b:e])
			}
			scaleRange(part, c.dt, factor)
		}
	})
}
