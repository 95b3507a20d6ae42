#include "textflag.h"

// The dot-product kernels keep a·b, |a|² and |b|² in two sets of four float64 lanes each:
// Y3, Y4, Y5 for the elements in Y0 (a) and Y1 (b), Y10, Y11, Y12 for those in Y8 and Y9.
#define ZERO_SUMS \
	VXORPD Y3, Y3, Y3; \
	VXORPD Y4, Y4, Y4; \
	VXORPD Y5, Y5, Y5; \
	VXORPD Y10, Y10, Y10; \
	VXORPD Y11, Y11, Y11; \
	VXORPD Y12, Y12, Y12

// ACCUMULATE adds the products of the eight float64s loaded into Y0, Y1, Y8 and Y9 (multiplied
// and added, not fused) to the sums.
#define ACCUMULATE \
	VMULPD Y0, Y1, Y2; \
	VADDPD Y2, Y3, Y3; \
	VMULPD Y0, Y0, Y2; \
	VADDPD Y2, Y4, Y4; \
	VMULPD Y1, Y1, Y2; \
	VADDPD Y2, Y5, Y5; \
	VMULPD Y8, Y9, Y2; \
	VADDPD Y2, Y10, Y10; \
	VMULPD Y8, Y8, Y2; \
	VADDPD Y2, Y11, Y11; \
	VMULPD Y9, Y9, Y2; \
	VADDPD Y2, Y12, Y12

// STORE_SUMS adds up each sum's lanes and stores them as the results dot, aa and bb.
#define STORE_SUMS \
	VADDPD       Y10, Y3, Y3; \
	VADDPD       Y11, Y4, Y4; \
	VADDPD       Y12, Y5, Y5; \
	VEXTRACTF128 $1, Y3, X0; \
	VADDPD       X0, X3, X3; \
	VHADDPD      X3, X3, X3; \
	MOVSD        X3, dot+24(FP); \
	VEXTRACTF128 $1, Y4, X0; \
	VADDPD       X0, X4, X4; \
	VHADDPD      X4, X4, X4; \
	MOVSD        X4, aa+32(FP); \
	VEXTRACTF128 $1, Y5, X0; \
	VADDPD       X0, X5, X5; \
	VHADDPD      X5, X5, X5; \
	MOVSD        X5, bb+40(FP)

// func adasumDotsFloat32AVX(a, b *float32, n int) (dot, aa, bb float64)
// The sums of a[i]*b[i], a[i]*a[i] and b[i]*b[i] over n floats (n a positive multiple of 8),
// widened exactly to float64, multiplied and added in float64 (no fused multiply-add), in two
// sets of four lanes each, added up at the end.
TEXT ·adasumDotsFloat32AVX(SB), NOSPLIT, $0-48
	MOVQ   a+0(FP), SI
	MOVQ   b+8(FP), DI
	MOVQ   n+16(FP), CX
	ZERO_SUMS

dots:
	VCVTPS2PD (SI), Y0
	VCVTPS2PD (DI), Y1
	VCVTPS2PD 16(SI), Y8
	VCVTPS2PD 16(DI), Y9
	ACCUMULATE
	ADDQ      $32, SI
	ADDQ      $32, DI
	SUBQ      $8, CX
	JNZ       dots

	STORE_SUMS
	VZEROUPPER
	RET

// func adasumCombineFloat32AVX(a, b *float32, n int, ca, cb float64)
// a[i] = float32(ca*float64(a[i]) + cb*float64(b[i])) for n floats (n a positive multiple of 4):
// widened exactly, multiplied and added in float64 (no fused multiply-add), narrowed to nearest
// even, as the scalar loop does.
TEXT ·adasumCombineFloat32AVX(SB), NOSPLIT, $0-40
	MOVQ         a+0(FP), SI
	MOVQ         b+8(FP), DI
	MOVQ         n+16(FP), CX
	VBROADCASTSD ca+24(FP), Y6
	VBROADCASTSD cb+32(FP), Y7

combine:
	VCVTPS2PD  (SI), Y0
	VCVTPS2PD  (DI), Y1
	VMULPD     Y6, Y0, Y0
	VMULPD     Y7, Y1, Y1
	VADDPD     Y1, Y0, Y0
	VCVTPD2PSY Y0, X0
	VMOVUPS    X0, (SI)
	ADDQ       $16, SI
	ADDQ       $16, DI
	SUBQ       $4, CX
	JNZ        combine
	VZEROUPPER
	RET

// func adasumDotsFloat64AVX(a, b *float64, n int) (dot, aa, bb float64)
// adasumDotsFloat32AVX for float64s (n a positive multiple of 8).
TEXT ·adasumDotsFloat64AVX(SB), NOSPLIT, $0-48
	MOVQ   a+0(FP), SI
	MOVQ   b+8(FP), DI
	MOVQ   n+16(FP), CX
	ZERO_SUMS

dots64:
	VMOVUPD (SI), Y0
	VMOVUPD (DI), Y1
	VMOVUPD 32(SI), Y8
	VMOVUPD 32(DI), Y9
	ACCUMULATE
	ADDQ    $64, SI
	ADDQ    $64, DI
	SUBQ    $8, CX
	JNZ     dots64

	STORE_SUMS
	VZEROUPPER
	RET

// func adasumCombineFloat64AVX(a, b *float64, n int, ca, cb float64)
// a[i] = ca*a[i] + cb*b[i] for n floats (n a positive multiple of 4), unfused, as the scalar
// loop computes it.
TEXT ·adasumCombineFloat64AVX(SB), NOSPLIT, $0-40
	MOVQ         a+0(FP), SI
	MOVQ         b+8(FP), DI
	MOVQ         n+16(FP), CX
	VBROADCASTSD ca+24(FP), Y6
	VBROADCASTSD cb+32(FP), Y7

combine64:
	VMOVUPD (SI), Y0
	VMOVUPD (DI), Y1
	VMULPD  Y6, Y0, Y0
	VMULPD  Y7, Y1, Y1
	VADDPD  Y1, Y0, Y0
	VMOVUPD Y0, (SI)
	ADDQ    $32, SI
	ADDQ    $32, DI
	SUBQ    $4, CX
	JNZ     combine64
	VZEROUPPER
	RET
