package fp16

import "golang.org/x/sys/cpu"

// hasF16C also requires AVX: the F16C instructions are VEX-encoded and write YMM registers.
var hasF16C = cpu.X86.HasF16C && cpu.X86.HasAVX

// encodeF16C narrows n float32s (n a positive multiple of 8) with VCVTPS2PH, round to nearest even.
//
//go:noescape
func encodeF16C(dst *uint16, src *float32, n int)

// decodeF16C widens n halves (n a positive multiple of 8) with VCVTPH2PS.
//
//go:noescape
func decodeF16C(dst *float32, src *uint16, n int)
