//go:build !amd64

package horovod

var hasAVX = false // a variable as on amd64, so that benchmarks can turn it off

func scaleFloat32AVX(v *float32, n int, f float32) { panic("horovod: AVX on a non-amd64 build") }
func scaleFloat32ViaFloat64AVX(v *float32, n int, f float64) {
	panic("horovod: AVX on a non-amd64 build")
}
func scaleFloat64AVX(v *float64, n int, f float64) { panic("horovod: AVX on a non-amd64 build") }
func adasumDotsFloat32AVX(a, b *float32, n int) (dot, aa, bb float64) {
	panic("horovod: AVX on a non-amd64 build")
}
func adasumCombineFloat32AVX(a, b *float32, n int, ca, cb float64) {
	panic("horovod: AVX on a non-amd64 build")
}
func adasumDotsFloat64AVX(a, b *float64, n int) (dot, aa, bb float64) {
	panic("horovod: AVX on a non-amd64 build")
}
func adasumCombineFloat64AVX(a, b *float64, n int, ca, cb float64) {
	panic("horovod: AVX on a non-amd64 build")
}
