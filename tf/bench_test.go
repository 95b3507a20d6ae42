package tf

import (
	"os"
	"path/filepath"
	"testing"
)

// BenchmarkSessionRun measures the per-call overhead of Session.Run on the trivial and
// small-matmul signatures of the two SavedModels ("graph": TF1 ops, "function": TF2 functions)
// that testdata/bench.py builds; bench.py runs it beside Python's session.run and
// concrete-function calls on the same SavedModels and prints the ratios (`make bench-tf`).
func BenchmarkSessionRun(b *testing.B) {
	dir := os.Getenv("GOROVOD_TF_BENCH_MODELS")
	if dir == "" {
		b.Skip("GOROVOD_TF_BENCH_MODELS is not set: run `make bench-tf`")
	}
	for _, model := range []string{"graph", "function"} {
		b.Run(model, func(b *testing.B) { benchmarkSignatures(b, filepath.Join(dir, model)) })
	}
}

func benchmarkSignatures(b *testing.B, dir string) {
	m, err := LoadSavedModel(dir, []string{"serve"}, nil)
	if err != nil {
		b.Fatal(err)
	}
	defer m.Close()
	for _, bc := range []struct {
		signature string
		shape     []int64
	}{{"trivial", nil}, {"matmul", []int64{8, 64}}} {
		b.Run(bc.signature, func(b *testing.B) {
			sig, err := m.Signature(bc.signature)
			if err != nil {
				b.Fatal(err)
			}
			in, err := m.Graph.Output(sig.Inputs[0].Name)
			if err != nil {
				b.Fatal(err)
			}
			out, err := m.Graph.Output(sig.Outputs[0].Name)
			if err != nil {
				b.Fatal(err)
			}
			x, err := NewTensor(make([]float32, numElements(bc.shape)), bc.shape...)
			if err != nil {
				b.Fatal(err)
			}
			defer x.Close()
			feeds := map[Output]*Tensor{in: x}
			fetches := []Output{out}
			var result []float32
			for b.Loop() {
				outs, err := m.Session.Run(feeds, fetches, nil)
				if err != nil {
					b.Fatal(err)
				}
				if result, err = Values(outs[0], result); err != nil {
					b.Fatal(err)
				}
				outs[0].Close()
			}
		})
	}
}
