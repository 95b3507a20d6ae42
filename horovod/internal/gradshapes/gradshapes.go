// Package gradshapes lists the gradient shapes of the models gorovod fine-tunes, for benchmarks
// that must reduce what a train step reduces without loading the model.
package gradshapes

import "math/rand/v2"

// MiniLM is the shape of each gradient of finetune's default model, all-MiniLM-L6-v2 with a
// two-label classifier head: 105 tensors, 22,713,986 float32 (91 MB), in the order of its
// variables.
func MiniLM() [][]int {
	const hidden, inner, layers = 384, 1536, 6
	shapes := [][]int{{30522, hidden}, {512, hidden}, {2, hidden}, {hidden}, {hidden}}
	for range layers {
		for range 4 { // query, key, value, attention output
			shapes = append(shapes, []int{hidden, hidden}, []int{hidden})
		}
		shapes = append(shapes, []int{hidden}, []int{hidden}, // attention LayerNorm
			[]int{hidden, inner}, []int{inner}, []int{inner, hidden}, []int{hidden},
			[]int{hidden}, []int{hidden}) // output LayerNorm
	}
	return append(shapes, []int{hidden, hidden}, []int{hidden}, []int{2, hidden}, []int{2})
}

// Random is one gradient per shape, each allocated apart as a train step's fetches are, with
// random values of a gradient's magnitude (the same for the same seed).
func Random(shapes [][]int, seed uint64) [][]float32 {
	r := rand.New(rand.NewPCG(seed, seed+1))
	grads := make([][]float32, len(shapes))
	for i, shape := range shapes {
		n := 1
		for _, d := range shape {
			n *= d
		}
		grads[i] = make([]float32, n)
		for j := range grads[i] {
			grads[i][j] = float32(r.NormFloat64() * 1e-3)
		}
	}
	return grads
}
