#include "textflag.h"

// func encodeAVX2(dst *uint16, src *float32, n int)
// Eight lanes per iteration, the arithmetic of FromFloat32: (b + 0x7fff + (b>>16 & 1)) >> 16, or
// b>>16 | 0x40 where |b| is a NaN's pattern; the 32-bit results are packed to 16 bits (they fit).
TEXT ·encodeAVX2(SB), NOSPLIT, $0-24
	MOVQ         dst+0(FP), DI
	MOVQ         src+8(FP), SI
	MOVQ         n+16(FP), CX
	MOVL         $0x7fff, AX
	VMOVD        AX, X10
	VPBROADCASTD X10, Y10
	MOVL         $1, AX
	VMOVD        AX, X11
	VPBROADCASTD X11, Y11
	MOVL         $0x7fffffff, AX
	VMOVD        AX, X12
	VPBROADCASTD X12, Y12
	MOVL         $0x7f800000, AX
	VMOVD        AX, X13
	VPBROADCASTD X13, Y13
	MOVL         $0x40, AX
	VMOVD        AX, X14
	VPBROADCASTD X14, Y14
loop8:
	VMOVDQU   (SI), Y0
	VPSRLD    $16, Y0, Y1
	VPAND     Y11, Y1, Y2
	VPADDD    Y10, Y0, Y3
	VPADDD    Y2, Y3, Y3
	VPSRLD    $16, Y3, Y3
	VPAND     Y12, Y0, Y4
	VPCMPGTD  Y13, Y4, Y5
	VPOR      Y14, Y1, Y6
	VPBLENDVB Y5, Y6, Y3, Y7
	VPACKUSDW Y7, Y7, Y8
	VPERMQ    $0x08, Y8, Y8
	VMOVDQU   X8, (DI)
	ADDQ      $32, SI
	ADDQ      $16, DI
	SUBQ      $8, CX
	JNZ       loop8
	VZEROUPPER
	RET

// func decodeAVX2(dst *float32, src *uint16, n int)
TEXT ·decodeAVX2(SB), NOSPLIT, $0-24
	MOVQ dst+0(FP), DI
	MOVQ src+8(FP), SI
	MOVQ n+16(FP), CX
loop8:
	VPMOVZXWD (SI), Y0
	VPSLLD    $16, Y0, Y0
	VMOVDQU   Y0, (DI)
	ADDQ      $16, SI
	ADDQ      $32, DI
	SUBQ      $8, CX
	JNZ       loop8
	VZEROUPPER
	RET
