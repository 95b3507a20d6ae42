//go:build !amd64

package fp16

const hasF16C = false

func encodeF16C(dst *uint16, src *float32, n int) { panic("fp16: F16C on a non-amd64 build") }
func decodeF16C(dst *float32, src *uint16, n int) { panic("fp16: F16C on a non-amd64 build") }
