package horovod

import (
	"github.com/gorovod/gorovod/horovod/bf16"
	"github.com/gorovod/gorovod/horovod/fp16"
)

// halfCodec converts a 16-bit float type (Float16 or BFloat16), carried as uint16 bit patterns,
// to and from float32 and float64. Arithmetic on such tensors (scaling, local accumulation, the
// compressed allreduce's widening) runs in float32 and rounds back once, to nearest even.
type halfCodec struct {
	encode32 func([]uint16, []float32)
	decode32 func([]float32, []uint16)
	encode64 func([]uint16, []float64)
	decode64 func([]float64, []uint16)
}

var (
	float16Codec  = halfCodec{fp16.EncodeFloat32, fp16.DecodeFloat32, fp16.EncodeFloat64, fp16.DecodeFloat64}
	bfloat16Codec = halfCodec{bf16.EncodeFloat32, bf16.DecodeFloat32, bf16.EncodeFloat64, bf16.DecodeFloat64}
)

// codecOf is the codec of a 16-bit float type; ok is false for every other type.
func codecOf(dt DType) (c halfCodec, ok bool) {
	switch dt {
	case Float16:
		return float16Codec, true
	case BFloat16:
		return bfloat16Codec, true
	}
	return halfCodec{}, false
}

// halfBlock is how many 16-bit values the element-wise operations widen at a time, on the stack.
const halfBlock = 2048

// mapHalves widens dst (and src, when given: the same length as dst) block by block, lets f
// compute on the float32 values, and rounds f's results back into dst.
func (c halfCodec) mapHalves(dst, src []uint16, f func(d, s []float32)) {
	var bd, bs [halfBlock]float32
	for off := 0; off < len(dst); off += halfBlock {
		end := min(off+halfBlock, len(dst))
		d, s := bd[:end-off], bs[:0]
		c.decode32(d, dst[off:end])
		if src != nil {
			s = bs[:end-off]
			c.decode32(s, src[off:end])
		}
		f(d, s)
		c.encode32(dst[off:end], d)
	}
}
