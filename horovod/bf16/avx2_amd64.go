package bf16

import "golang.org/x/sys/cpu"

var hasAVX2 = cpu.X86.HasAVX2

// encodeAVX2 narrows n float32s (n a positive multiple of 8), bit for bit as FromFloat32.
//
//go:noescape
func encodeAVX2(dst *uint16, src *float32, n int)

// decodeAVX2 widens n bfloat16s (n a positive multiple of 8).
//
//go:noescape
func decodeAVX2(dst *float32, src *uint16, n int)
