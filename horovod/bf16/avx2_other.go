//go:build !amd64

package bf16

const hasAVX2 = false

func encodeAVX2(dst *uint16, src *float32, n int) { panic("bf16: AVX2 on a non-amd64 build") }
func decodeAVX2(dst *float32, src *uint16, n int) { panic("bf16: AVX2 on a non-amd64 build") }
