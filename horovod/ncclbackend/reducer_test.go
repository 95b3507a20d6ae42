package ncclbackend

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"slices"
	"strings"
	"testing"

	"github.com/gorovod/gorovod/horovod"
	"github.com/gorovod/gorovod/horovod/backend"
	"github.com/gorovod/gorovod/horovod/local"
)

// bertBaseShapes are the shapes of the trainable variables of BERT-base uncased (12 layers,
// hidden size 768, intermediate size 3072, vocabulary 30522, 512 positions, 2 token types) with
// run_classifier's two-label output layer, in the order of Google's checkpoint: 201 gradients,
// bertBaseParameters values, most of them 768x768 kernels (2.36 MB) and 768-element vectors.
func bertBaseShapes() [][]int {
	const hidden, inner, layers, vocab, positions, types, labels = 768, 3072, 12, 30522, 512, 2, 2
	shapes := [][]int{
		{vocab, hidden}, {types, hidden}, {positions, hidden}, // word, token type, position embeddings
		{hidden}, {hidden}, // embeddings LayerNorm gamma, beta
	}
	for range layers {
		for range 3 { // attention query, key, value: kernel, bias
			shapes = append(shapes, []int{hidden, hidden}, []int{hidden})
		}
		shapes = append(shapes,
			[]int{hidden, hidden}, []int{hidden}, // attention output dense
			[]int{hidden}, []int{hidden}, // attention output LayerNorm
			[]int{hidden, inner}, []int{inner}, // intermediate dense
			[]int{inner, hidden}, []int{hidden}, // output dense
			[]int{hidden}, []int{hidden}) // output LayerNorm
	}
	return append(shapes,
		[]int{hidden, hidden}, []int{hidden}, // pooler dense
		[]int{labels, hidden}, []int{labels}) // classifier output_weights, output_bias
}

// gradients makes one float32 gradient per shape, each allocated apart as a train step's
// fetches are, with values exact in float16 (so fp16 compression at size 1 returns them as they
// were).
func gradients(t testing.TB, shapes [][]int) []horovod.NamedTensor {
	grads := make([]horovod.NamedTensor, len(shapes))
	k := 0
	for i, shape := range shapes {
		n := 1
		for _, d := range shape {
			n *= d
		}
		v := make([]float32, n)
		for j := range v {
			v[j] = float32((k+j)%1000-500) / 1024
		}
		k += n
		g, err := horovod.NewTensor(shape, v)
		if err != nil {
			t.Fatal(err)
		}
		grads[i] = horovod.NamedTensor{Name: fmt.Sprintf("g%03d", i), Tensor: g}
	}
	return grads
}

// stagedOnly is the NCCL backend without its backend.HostAllocator: a Reducer over it keeps
// its arenas in Go memory, which every collective stages through pinned memory (the path before
// the backend lent memory, and the path of every Allreduce on memory horovod allocates).
type stagedOnly struct{ backend.Backend }

// initNCCL starts a job of size 1 whose collectives run on the NCCL backend (over the fake
// libraries without a GPU); lend false hides the backend's HostAllocator. It returns the
// backend too.
func initNCCL(t testing.TB, lend bool, opts ...horovod.Option) (*horovod.Horovod, *Backend) {
	t.Helper()
	fakeUnlessGPU(t)
	var nb *Backend
	open := func(control backend.Backend) (backend.Backend, error) {
		b, err := Open(control, Config{Logf: t.Logf})
		if err != nil {
			return nil, err
		}
		nb = b
		if !lend {
			return stagedOnly{b}, nil
		}
		return b, nil
	}
	h, err := horovod.Init(append([]horovod.Option{horovod.WithBackend(local.Backend{}), horovod.WithDataBackend(open)}, opts...)...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := h.Shutdown(); err != nil {
			t.Error(err)
		}
	})
	if h.Backend() != "nccl" {
		t.Fatalf("the collectives run on %q", h.Backend())
	}
	return h, nb
}

// TestReducerOverNCCL runs Reducer steps (uncompressed, fp16, fp16 with a predivide factor)
// over the NCCL backend with its lent memory, over the NCCL backend staging Go memory, and over
// the local backend: the results must be the same bytes, and with lent memory the results must
// lie in it, with no staging buffer allocated (every allreduce ran in place on an arena).
func TestReducerOverNCCL(t *testing.T) {
	shapes := [][]int{{3, 700}, {700}, {5}, {64, 300}, {1}}
	opts := []horovod.ReducerOptions{
		{},
		{Compression: horovod.FP16Compression},
		{Compression: horovod.FP16Compression, GradientPredivideFactor: 4},
	}
	run := func(h *horovod.Horovod, nb *Backend) [][]byte {
		var out [][]byte
		for _, o := range opts {
			r, err := h.NewReducer(o)
			if err != nil {
				t.Fatal(err)
			}
			for step := range 2 {
				reduced, _, err := r.Reduce(gradients(t, shapes))
				if err != nil {
					t.Fatalf("%+v: %v", o, err)
				}
				var b []byte
				for _, g := range reduced {
					b = append(b, g.Data...)
					if nb != nil && nb.lent.allocs != nil {
						if _, _, ok := nb.lent.find(g.Data); !ok {
							t.Errorf("%+v, step %d: result %s is not in lent memory", o, step, g.Name)
						}
					}
				}
				out = append(out, b)
			}
			if err := r.Close(); err != nil {
				t.Fatal(err)
			}
		}
		return out
	}
	hl, err := horovod.Init(horovod.WithBackend(local.Backend{}))
	if err != nil {
		t.Fatal(err)
	}
	defer hl.Shutdown()
	want := run(hl, nil)
	h, nb := initNCCL(t, true)
	lent := run(h, nb)
	if nb.pinned != nil {
		t.Errorf("Reducer steps on lent arenas allocated a %d-byte staging buffer", nb.pinned.Size())
	}
	if len(nb.lent.allocs) != 0 {
		t.Errorf("%d allocations still lent after every Reducer's Close", len(nb.lent.allocs))
	}
	hs, _ := initNCCL(t, false)
	staged := run(hs, nil)
	for i := range want {
		if !bytes.Equal(lent[i], want[i]) || !bytes.Equal(staged[i], want[i]) {
			t.Errorf("step %d: lent arenas equal the local backend: %v, staged arenas: %v", i, bytes.Equal(lent[i], want[i]), bytes.Equal(staged[i], want[i]))
		}
	}
}

// BenchmarkReducerStepBERTBase is what finetune pays on the host per step to average BERT-base's
// gradients (its 201 tensors as a train step fetches them) on one GPU: horovod at size 1 with
// the NCCL data backend, a Reducer step uncompressed (none) and fp16-compressed. With
// arenas=pinned the Reducer's arenas are the backend's pinned memory, so the fused allreduces
// run in place there with no staging copy; with arenas=go they are Go memory, staged through
// pinned memory on the way to the device and back (the path before the backend lent memory).
// Without a GPU it runs over the fake libraries, whose "DMA" is a memcpy.
func BenchmarkReducerStepBERTBase(b *testing.B) {
	grads := gradients(b, bertBaseShapes())
	total := 0
	for _, g := range grads {
		total += g.NumElements()
	}
	if len(grads) != 201 || total != bertBaseParameters {
		b.Fatalf("%d gradients of %d values, want 201 of %d", len(grads), total, bertBaseParameters)
	}
	for _, arenas := range []string{"pinned", "go"} {
		b.Run("arenas="+arenas, func(b *testing.B) {
			h, _ := initNCCL(b, arenas == "pinned")
			for _, c := range []struct {
				name string
				opts horovod.ReducerOptions
			}{
				{"none", horovod.ReducerOptions{}},
				{"fp16", horovod.ReducerOptions{Compression: horovod.FP16Compression}},
			} {
				b.Run(c.name, func(b *testing.B) {
					r, err := h.NewReducer(c.opts)
					if err != nil {
						b.Fatal(err)
					}
					defer r.Close()
					var reduced []horovod.NamedTensor
					step := func() {
						if reduced, _, err = r.Reduce(grads); err != nil {
							b.Fatal(err)
						}
					}
					step() // allocates the arenas and the backend's device (and staging) buffers
					b.SetBytes(int64(4 * total))
					iter := 0
					for b.Loop() {
						// A new first value in every gradient each step (exact in float16), so
						// that a step that wrote no results would fail the check below.
						iter++
						v := float32(iter%1000-500) / 1024
						for _, g := range grads {
							binary.LittleEndian.PutUint32(g.Data, math.Float32bits(v))
						}
						step()
					}
					for i, g := range reduced { // the average over one rank is the gradient
						if !bytes.Equal(g.Data, grads[i].Data) {
							b.Fatalf("gradient %s: the last step's result differs from its input", g.Name)
						}
					}
				})
			}
		})
	}
}

// exactGradient is a float32 gradient of n values k/1024 (|k| < 512), exact in float16.
func exactGradient(name string, n, seed int) horovod.NamedTensor {
	v := make([]float32, n)
	for i := range v {
		v[i] = float32((i*7+seed)%1000-500) / 1024
	}
	t, err := horovod.NewTensor([]int{n}, v)
	if err != nil {
		panic(err)
	}
	return horovod.NamedTensor{Name: name, Tensor: t}
}

// TestReducerResultsHandedBackOverNCCL gives a step's results back to Reduce in another
// arrangement (behind another gradient that takes their place in the result arena; shifted by a
// gradient of another dtype, so that each lies partly over its new result slot, over several
// staging chunks), uncompressed and with fp16, over the NCCL backend with lent arenas, with Go
// arenas, and over the local backend. At size 1 the step must return them unchanged, and every
// backend the same bytes.
func TestReducerResultsHandedBackOverNCCL(t *testing.T) {
	const M = 1 << 20
	w := make([]int32, 2*M)
	for i := range w {
		w[i] = int32(i)
	}
	wt, err := horovod.NewTensor([]int{len(w)}, w)
	if err != nil {
		t.Fatal(err)
	}
	wg := horovod.NamedTensor{Name: "w", Tensor: wt}
	g := exactGradient
	cases := []struct {
		name                string
		first, second, then []horovod.NamedTensor
	}{
		{"behind another", []horovod.NamedTensor{g("x", 1000, 1), g("a", 1000, 2), g("b", 1000, 3)}, []horovod.NamedTensor{g("a", 1000, 4), g("b", 1000, 5)}, []horovod.NamedTensor{g("x", 1000, 6)}},
		{"shifted", []horovod.NamedTensor{g("a", 5*M, 1), g("b", 5*M, 2), wg}, []horovod.NamedTensor{g("z", M, 3), g("a", 5*M, 4), g("b", 5*M, 5)}, []horovod.NamedTensor{wg}},
	}
	run := func(what string, h *horovod.Horovod) []byte {
		var all []byte
		for _, o := range []horovod.ReducerOptions{{}, {Compression: horovod.FP16Compression}} {
			r, err := h.NewReducer(o)
			if err != nil {
				t.Fatal(err)
			}
			for _, c := range cases {
				if _, _, err := r.Reduce(c.first); err != nil {
					t.Fatal(err)
				}
				res, _, err := r.Reduce(c.second)
				if err != nil {
					t.Fatal(err)
				}
				given := res[len(res)-2:]
				want := [][]byte{bytes.Clone(given[0].Data), bytes.Clone(given[1].Data)}
				res, _, err = r.Reduce(append(slices.Clone(c.then), given...))
				if err != nil {
					t.Fatal(err)
				}
				for i, got := range res[len(res)-2:] {
					if !bytes.Equal(got.Data, want[i]) {
						t.Errorf("%s, %+v, %s: result %q of a step given the previous results differs from them", what, o, c.name, got.Name)
					}
					all = append(all, got.Data...)
				}
			}
			if err := r.Close(); err != nil {
				t.Fatal(err)
			}
		}
		return all
	}
	hl, err := horovod.Init(horovod.WithBackend(local.Backend{}))
	if err != nil {
		t.Fatal(err)
	}
	defer hl.Shutdown()
	want := run("local", hl)
	for _, lend := range []bool{true, false} {
		h, _ := initNCCL(t, lend)
		if got := run(fmt.Sprintf("nccl, lent arenas %v", lend), h); !bytes.Equal(got, want) {
			t.Errorf("nccl, lent arenas %v: the results differ from the local backend's", lend)
		}
	}
}

// TestReduceAfterShutdown: once horovod is shut down, Reduce returns the error collectives
// return then (ErrShutdown), without touching the arenas, which Shutdown freed with the NCCL
// backend (fp16 compression would write its wire arena first), and Close does nothing; on the
// NCCL backend with lent memory and on the local backend.
func TestReduceAfterShutdown(t *testing.T) {
	for _, c := range []string{"nccl", "local"} {
		var h *horovod.Horovod
		if c == "nccl" {
			h, _ = initNCCL(t, true)
		} else {
			var err error
			if h, err = horovod.Init(horovod.WithBackend(local.Backend{})); err != nil {
				t.Fatal(err)
			}
		}
		r, err := h.NewReducer(horovod.ReducerOptions{Compression: horovod.FP16Compression})
		if err != nil {
			t.Fatal(err)
		}
		grads := []horovod.NamedTensor{exactGradient("a", 1<<16, 1), exactGradient("b", 1000, 2)}
		if _, _, err := r.Reduce(grads); err != nil {
			t.Fatal(err)
		}
		if err := h.Shutdown(); err != nil {
			t.Fatal(err)
		}
		for range 2 {
			if _, ready, err := r.Reduce(grads); !errors.Is(err, horovod.ErrShutdown) || ready {
				t.Errorf("%s: Reduce after Shutdown: ready %v, %v; want ErrShutdown", c, ready, err)
			}
		}
		if err := r.Close(); err != nil {
			t.Errorf("%s: Close after Shutdown: %v", c, err)
		}
	}
}

// TestReducerWithoutPinnedMemory: when cudaHostAlloc fails (out of pinned memory), the arenas
// and the fusion buffer are Go memory instead, which the backend stages (its staging buffer
// allocated before): the steps give the same results as with pinned memory, and horovod says
// why, once. Over the fake libraries only: it makes cudaHostAlloc fail.
func TestReducerWithoutPinnedMemory(t *testing.T) {
	setupFakeLibraries(t)
	grads := gradients(t, [][]int{{3, 700}, {700}, {5}})
	steps := func(h *horovod.Horovod) [][]byte {
		r, err := h.NewReducer(horovod.ReducerOptions{Compression: horovod.FP16Compression})
		if err != nil {
			t.Fatal(err)
		}
		defer r.Close()
		var out [][]byte
		for range 2 {
			res, _, err := r.Reduce(grads)
			if err != nil {
				t.Fatal(err)
			}
			for _, g := range res {
				out = append(out, bytes.Clone(g.Data))
			}
		}
		// Tensors apart fuse in the fusion buffer, which is Go memory too when pinned fails.
		grouped, err := h.GroupedAllreduce(grads, horovod.AllreduceOptions{})
		if err != nil {
			t.Fatal(err)
		}
		for _, g := range grouped {
			out = append(out, g.Data)
		}
		return out
	}
	h, nb := initNCCL(t, true)
	want := steps(h)
	if len(nb.lent.allocs) != 1 { // the fusion buffer; the Reducer's arenas were given back
		t.Fatalf("%d allocations lent with cudaHostAlloc working, want 1", len(nb.lent.allocs))
	}
	var log bytes.Buffer
	hf, nf := initNCCL(t, true, horovod.WithLogOutput(&log))
	if _, err := hf.Allreduce("staging", grads[0].Tensor, horovod.AllreduceOptions{}); err != nil {
		t.Fatal(err) // Go memory both sides: allocates the staging buffer while it still can
	}
	t.Setenv("FAKE_FAIL", "cudaHostAlloc:2")
	got := steps(hf)
	for i := range want {
		if !bytes.Equal(got[i], want[i]) {
			t.Errorf("result %d in Go memory differs from the one in pinned memory", i)
		}
	}
	if len(nf.lent.allocs) != 0 {
		t.Errorf("%d allocations lent while cudaHostAlloc fails", len(nf.lent.allocs))
	}
	if n := strings.Count(log.String(), "using Go memory instead"); n != 1 || !strings.Contains(log.String(), "cudaErrorMemoryAllocation") {
		t.Errorf("logged %d times that pinned memory failed, want once naming the CUDA error:\n%s", n, log.String())
	}
}

// Reducescatter and Alltoall run over the NCCL backend, which has neither collective of its
// own, through an allreduce and an allgather in horovod's fusion buffer (lent pinned memory, or
// staged Go memory): in a job of one rank each gives back its input, scaled as asked.
func TestReducescatterAndAlltoallOverNCCL(t *testing.T) {
	for _, lend := range []bool{true, false} {
		h, _ := initNCCL(t, lend)
		in := []float32{1, 2, 3, 4, 5, 6}
		x, err := horovod.NewTensor([]int{3, 2}, in)
		if err != nil {
			t.Fatal(err)
		}
		rs, err := h.Reducescatter(fmt.Sprintf("rs/%v", lend), x, horovod.ReducescatterOptions{Op: horovod.Sum, Postscale: 2})
		if err != nil {
			t.Fatal(err)
		}
		if got, _ := horovod.Values[float32](rs); !slices.Equal(got, []float32{2, 4, 6, 8, 10, 12}) || !slices.Equal(rs.Shape, []int{3, 2}) {
			t.Errorf("lend=%v: reducescatter %v%v", lend, got, rs.Shape)
		}
		a2a, from, err := h.Alltoall(fmt.Sprintf("a2a/%v", lend), x, nil)
		if err != nil {
			t.Fatal(err)
		}
		if got, _ := horovod.Values[float32](a2a); !slices.Equal(got, in) || !slices.Equal(from, []int{3}) {
			t.Errorf("lend=%v: alltoall %v from %v", lend, got, from)
		}
	}
}
