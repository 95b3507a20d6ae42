package tf

import (
	"errors"
	"fmt"
	"path/filepath"
	"sync"
	"testing"
)

// TestUseAfterGraphClose calls every method of a graph, its operations and outputs, and of a
// session on it, after the graph is closed: each must fail with ErrClosed or return its zero
// value, not dereference the freed (nil) TF_Graph.
func TestUseAfterGraphClose(t *testing.T) {
	s, in, out := identitySession(t, Float, []int64{-1})
	g := s.Graph()
	op := g.Operation("out")
	if op == nil {
		t.Fatal("no operation out")
	}
	x, _ := NewTensor([]float32{1, 2}, 2)
	defer x.Close()
	g.Close()
	g.Close()

	if got := g.Operation("out"); got != nil {
		t.Errorf("Operation after Close: %v, want nil", got)
	}
	if got := g.Operations(); got != nil {
		t.Errorf("Operations after Close: %d, want none", len(got))
	}
	errs := map[string]error{
		"Import": g.Import(identityGraphDef(Float, nil), "again"),
	}
	_, errs["Output"] = g.Output("out:0")
	_, errs["NewSession"] = NewSession(g, nil)
	_, _, errs["Output.Shape"] = in.Shape()
	_, errs["Session.Run"] = s.Run(map[Output]*Tensor{in: x}, []Output{out}, nil)
	for call, err := range errs {
		if !errors.Is(err, ErrClosed) {
			t.Errorf("%s after Graph.Close: %v, want ErrClosed", call, err)
		}
	}
	if name, typ, dev, n := op.Name(), op.Type(), op.Device(), op.NumOutputs(); name != "" || typ != "" || dev != "" || n != 0 {
		t.Errorf("Operation methods after Close: %q %q %q %d, want zero values", name, typ, dev, n)
	}
	if dt := in.DataType(); dt != 0 {
		t.Errorf("Output.DataType after Close: %s, want 0", dt)
	}
}

// TestUseAfterSavedModelClose: every call on a closed SavedModel fails with ErrClosed, and so
// do the calls on its session and graph.
func TestUseAfterSavedModelClose(t *testing.T) {
	dir, _ := models(t)
	m, err := LoadSavedModel(filepath.Join(dir, "tf1"), []string{"serve"}, nil)
	if err != nil {
		t.Fatal(err)
	}
	n, _ := NewTensor([]int32{1})
	defer n.Close()
	if err := m.Close(); err != nil {
		t.Fatal(err)
	}
	errs := map[string]error{"Restore": m.Restore(filepath.Join(t.TempDir(), "ckpt"))}
	_, errs["Save"] = m.Save(filepath.Join(t.TempDir(), "ckpt"))
	_, errs["RunSignature"] = m.RunSignature("spin", map[string]*Tensor{"n": n})
	_, errs["Graph.Output"] = m.Graph.Output("spin_n:0")
	_, errs["Session.Run"] = m.Session.Run(nil, nil, nil)
	for call, err := range errs {
		if !errors.Is(err, ErrClosed) {
			t.Errorf("%s after Close: %v, want ErrClosed", call, err)
		}
	}
	if err := m.Close(); err != nil {
		t.Errorf("second Close: %v", err)
	}
}

// TestSaveConcurrentWithClose saves from several goroutines while the SavedModel is closed:
// Close must wait for the saves in flight (they succeed) and the later ones fail with
// ErrClosed; a save that looked the SaverDef up in a freed graph would crash or trip -race.
// The window is narrow, so the test closes several models.
func TestSaveConcurrentWithClose(t *testing.T) {
	dir, _ := models(t)
	for round := range 5 {
		m, err := LoadSavedModel(filepath.Join(dir, "tf1"), []string{"serve"}, nil)
		if err != nil {
			t.Fatal(err)
		}
		const workers = 4
		ckpts := t.TempDir()
		var saving, done sync.WaitGroup
		saving.Add(workers)
		errs := make(chan error, workers)
		for w := range workers {
			done.Go(func() {
				for i := 0; ; i++ {
					_, err := m.Save(filepath.Join(ckpts, fmt.Sprintf("w%d-%d", w, i)))
					if i == 0 {
						saving.Done() // every worker has saved once before Close starts
					}
					if err != nil {
						if !errors.Is(err, ErrClosed) {
							errs <- fmt.Errorf("round %d, worker %d, save %d: %w", round, w, i, err)
						}
						return
					}
				}
			})
		}
		saving.Wait()
		if err := m.Close(); err != nil {
			t.Fatal(err)
		}
		done.Wait()
		close(errs)
		for err := range errs {
			t.Error(err)
		}
	}
}
