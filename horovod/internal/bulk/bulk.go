// Package bulk runs a bulk conversion the way packages fp16 and bf16 share: whole groups of
// SIMD lanes in assembly when the CPU has it, the remainder one element at a time.
package bulk

// Convert converts src into dst (len(dst) at least len(src)): the longest prefix that is a
// multiple of width elements with simd when it is not nil, the rest with scalar. simd must give
// scalar's results bit for bit.
func Convert[D, S any](dst []D, src []S, width int, simd func(dst *D, src *S, n int), scalar func(S) D) {
	dst = dst[:len(src)]
	n := 0
	if simd != nil {
		if n = len(src) / width * width; n > 0 {
			simd(&dst[0], &src[0], n)
		}
	}
	for i := n; i < len(src); i++ {
		dst[i] = scalar(src[i])
	}
}
