package horovod

// adasumDotsFloat32AVX returns the float64 sums of a[i]*b[i], a[i]² and b[i]² over n float32s
// (n a positive multiple of 8), eight lanes at a time.
//
//go:noescape
func adasumDotsFloat32AVX(a, b *float32, n int) (dot, aa, bb float64)

// adasumCombineFloat32AVX sets a[i] to float32(ca*float64(a[i]) + cb*float64(b[i])) for n
// float32s (n a positive multiple of 4), four lanes at a time.
//
//go:noescape
func adasumCombineFloat32AVX(a, b *float32, n int, ca, cb float64)

// adasumDotsFloat64AVX is adasumDotsFloat32AVX for float64s (n a positive multiple of 8).
//
//go:noescape
func adasumDotsFloat64AVX(a, b *float64, n int) (dot, aa, bb float64)

// adasumCombineFloat64AVX sets a[i] to ca*a[i] + cb*b[i] for n float64s (n a positive multiple
// of 4), four lanes at a time.
//
//go:noescape
func adasumCombineFloat64AVX(a, b *float64, n int, ca, cb float64)
