#include "textflag.h"

// func scaleFloat32AVX(v *float32, n int, f float32)
// v[i] *= f for n floats (n a positive multiple of 8), eight lanes per instruction: the same IEEE
// multiplication, rounded once, as the scalar loop.
TEXT ·scaleFloat32AVX(SB), NOSPLIT, $0-20
	MOVQ         v+0(FP), DI
	MOVQ         n+8(FP), CX
	VBROADCASTSS f+16(FP), Y1

loop32:
	VMULPS  (DI), Y1, Y0
	VMOVUPS Y0, (DI)
	ADDQ    $32, DI
	SUBQ    $8, CX
	JNZ     loop32
	VZEROUPPER
	RET

// func scaleFloat32ViaFloat64AVX(v *float32, n int, f float64)
// v[i] = float32(float64(v[i]) * f) for n floats (n a positive multiple of 4): widened exactly,
// multiplied in float64, narrowed with the current rounding mode (to nearest even), as Go's
// conversion does.
TEXT ·scaleFloat32ViaFloat64AVX(SB), NOSPLIT, $0-24
	MOVQ         v+0(FP), DI
	MOVQ         n+8(FP), CX
	VBROADCASTSD f+16(FP), Y1

loop64:
	VCVTPS2PD  (DI), Y0
	VMULPD     Y1, Y0, Y0
	VCVTPD2PSY Y0, X0
	VMOVUPS    X0, (DI)
	ADDQ       $16, DI
	SUBQ       $4, CX
	JNZ        loop64
	VZEROUPPER
	RET

// func scaleFloat64AVX(v *float64, n int, f float64)
// v[i] *= f for n floats (n a positive multiple of 4).
TEXT ·scaleFloat64AVX(SB), NOSPLIT, $0-24
	MOVQ         v+0(FP), DI
	MOVQ         n+8(FP), CX
	VBROADCASTSD f+16(FP), Y1

loopf64:
	VMULPD  (DI), Y1, Y0
	VMOVUPD Y0, (DI)
	ADDQ    $32, DI
	SUBQ    $4, CX
	JNZ     loopf64
	VZEROUPPER
	RET
