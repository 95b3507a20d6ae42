package tf

import (
	"bytes"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/gorovod/gorovod/tf/testenv"
)

// TestConcurrentRuns runs one signature from many goroutines with different inputs; each
// result must equal what the same input gives when run alone. Run under -race by make test.
func TestConcurrentRuns(t *testing.T) {
	m := load(t, "tf1")
	const workers, runs = 8, 20
	inputs := make([]*Tensor, workers)
	want := make([]encodedTensor, workers)
	for w := range inputs {
		x := make([]float32, 3*4)
		for i := range x {
			x[i] = float32(w*100+i) / 7
		}
		inputs[w], _ = NewTensor(x, 3, 4)
		defer inputs[w].Close()
		want[w] = runPredict(t, m, "serving_default", inputs[w])
	}
	var wg sync.WaitGroup
	errs := make(chan error, workers*runs)
	for w := range workers {
		wg.Go(func() {
			for range runs {
				outs, err := m.RunSignature("serving_default", map[string]*Tensor{"x": inputs[w]}, "logits")
				if err != nil {
					errs <- err
					return
				}
				got, _ := outs[0].Float32s()
				if !bytes.Equal(le[float32](t)(got, nil), want[w].Data) {
					errs <- errors.New("worker " + strconv.Itoa(w) + ": result differs from its lone run")
				}
				outs[0].Close()
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
}

// TestCloseWaitsForRunsInFlight closes the SavedModel while a long run is in flight (past
// the session's gate, on its way into or inside TensorFlow). Close must wait for it: closing
// and deleting the TF_Session under it would cancel the run or crash, so the run must come
// back with its full result; runs after Close fail with ErrClosed.
func TestCloseWaitsForRunsInFlight(t *testing.T) {
	dir, _ := models(t)
	m, err := LoadSavedModel(dir+"/tf1", []string{"serve"}, nil)
	if err != nil {
		t.Fatal(err)
	}
	const spins = 150_000
	n, _ := NewTensor([]int32{spins})
	defer n.Close()

	var returned atomic.Bool
	var count []int32
	var runErr error
	var wg sync.WaitGroup
	wg.Go(func() {
		outs, err := m.RunSignature("spin", map[string]*Tensor{"n": n})
		returned.Store(true)
		if runErr = err; err == nil {
			count, runErr = outs[0].Int32s()
			outs[0].Close()
		}
	})
	// Wait for the run to pass the session's gate, however long the goroutine takes to start
	// on a loaded machine; from there its spin loop lasts far longer than a poll.
	for m.Session.gate.running() == 0 {
		time.Sleep(100 * time.Microsecond)
	}
	if returned.Load() {
		t.Fatal("the run ended before Close was called: raise spins")
	}
	if err := m.Close(); err != nil {
		t.Fatal(err)
	}
	wg.Wait()
	if runErr != nil {
		t.Fatalf("the run in flight failed: %v", runErr)
	}
	if len(count) != 1 || count[0] != spins {
		t.Fatalf("the run in flight returned %v, want [%d]", count, spins)
	}
	if _, err := m.RunSignature("spin", map[string]*Tensor{"n": n}); !errors.Is(err, ErrClosed) {
		t.Fatalf("run after Close: %v, want ErrClosed", err)
	}
	if err := m.Close(); err != nil {
		t.Fatalf("second Close: %v", err)
	}
}

// TestRunDoesNotGrowMemory runs 100,000 steps, each with fresh float and string feeds (long
// strings, whose heap parts the binding frees) and their outputs, and bounds the growth of the
// resident set between step 10,000 and the end.
func TestRunDoesNotGrowMemory(t *testing.T) {
	if raceEnabled {
		t.Skip("the race detector's shadow memory grows the RSS on its own")
	}
	sf, inF, outF := identitySession(t, Float, []int64{-1})
	ss, inS, outS := identitySession(t, String, nil)
	long := strings.Repeat("a string well past the 22-byte inline limit of TF_TString ", 4)
	step := func(i int) {
		x, err := NewTensor([]float32{float32(i), 1, 2, 3}, 4)
		if err != nil {
			t.Fatal(err)
		}
		s, err := NewStringTensor([]string{long, strconv.Itoa(i)}, 2)
		if err != nil {
			t.Fatal(err)
		}
		of, err := sf.Run(map[Output]*Tensor{inF: x}, []Output{outF}, nil)
		if err != nil {
			t.Fatal(err)
		}
		os, err := ss.Run(map[Output]*Tensor{inS: s}, []Output{outS}, nil)
		if err != nil {
			t.Fatal(err)
		}
		if v, _ := of[0].Float32s(); v[0] != float32(i) {
			t.Fatalf("step %d: got %v", i, v)
		}
		if v, _ := os[0].Strings(); v[1] != strconv.Itoa(i) {
			t.Fatalf("step %d: got %q", i, v)
		}
		for _, tensor := range []*Tensor{x, s, of[0], os[0]} {
			tensor.Close()
		}
	}
	for i := range 10_000 {
		step(i)
	}
	before := rssBytes(t)
	for i := 10_000; i < 100_000; i++ {
		step(i)
	}
	after := rssBytes(t)
	t.Logf("RSS %d MiB after 10,000 steps, %d MiB after 100,000", before>>20, after>>20)
	// A leak of one feed's long string per step would be 90,000 * 232 bytes = 20 MiB.
	if after-before > 8<<20 {
		t.Errorf("RSS grew by %d MiB over 90,000 steps", (after-before)>>20)
	}
}

func rssBytes(t *testing.T) int64 {
	b, err := os.ReadFile("/proc/self/statm")
	if err != nil {
		t.Skip("no /proc/self/statm:", err)
	}
	pages, err := strconv.ParseInt(strings.Fields(string(b))[1], 10, 64)
	if err != nil {
		t.Fatal(err)
	}
	return pages * int64(os.Getpagesize())
}

func TestListDevices(t *testing.T) {
	s, _, _ := identitySession(t, Float, nil)
	devices, err := s.ListDevices()
	if err != nil {
		t.Fatal(err)
	}
	var cpu bool
	for _, d := range devices {
		t.Logf("%s %s %d", d.Name, d.Type, d.MemoryBytes)
		cpu = cpu || d.Type == "CPU" && strings.HasSuffix(d.Name, "/device:CPU:0")
	}
	if !cpu {
		t.Errorf("no CPU:0 among %v", devices)
	}
}

func TestVersion(t *testing.T) {
	pinned, err := os.ReadFile("../third_party/tensorflow/VERSION")
	if err != nil {
		t.Fatal(err)
	}
	if got := Version(); got != strings.TrimSpace(string(pinned)) {
		t.Errorf("Version() = %q, pinned %q", got, pinned)
	}
	if _, want := models(t); Version() != want.TFVersion {
		t.Errorf("Version() = %q, Python's tf.__version__ %q", Version(), want.TFVersion)
	}
}

// A CUDA build of TensorFlow has GPU kernels of MatMul, a CPU build none: finetune computes on a
// GPU only where there are.
func TestKernelDeviceTypes(t *testing.T) {
	types, err := KernelDeviceTypes("MatMul")
	if err != nil {
		t.Fatal(err)
	}
	_, want := models(t)
	if !slices.Contains(types, "CPU") || slices.Contains(types, "GPU") != want.CUDABuild {
		t.Errorf("MatMul has kernels for %v; Python's tf.test.is_built_with_cuda() is %v", types, want.CUDABuild)
	}
}

func TestRunRawGraph(t *testing.T) {
	s, in, out := identitySession(t, Int64, []int64{2, -1})
	if got := in.DataType(); got != Int64 {
		t.Errorf("in dtype %s", got)
	}
	if dims, known, err := in.Shape(); err != nil || !known || len(dims) != 2 || dims[0] != 2 || dims[1] != -1 {
		t.Errorf("in shape %v %v %v", dims, known, err)
	}
	x, _ := NewTensor([]int64{1, -2, 3, 1 << 62, 5, 6}, 2, 3)
	defer x.Close()
	// Fetching the same output twice gives two tensors, in the order asked.
	outs, err := s.Run(map[Output]*Tensor{in: x}, []Output{out, out}, nil)
	if err != nil {
		t.Fatal(err)
	}
	for i, o := range outs {
		v, err := o.Int64s()
		if err != nil || len(v) != 6 || v[3] != 1<<62 || len(o.Shape()) != 2 || o.Shape()[1] != 3 {
			t.Errorf("output %d: %v %v %v", i, v, o.Shape(), err)
		}
		o.Close()
	}
	if _, err := s.Run(nil, []Output{out}, nil); err == nil || !strings.Contains(err.Error(), "run out:0") {
		t.Errorf("run without its feed: %v", err)
	}
}

// TestRunRejectsBadOutputs feeds and fetches outputs that do not exist: TensorFlow would read
// past the operation's outputs for an index out of range, a zero Output has no operation, and
// an output of another graph would be looked up by name in the session's. Each is an error
// naming the output, and the session still runs afterwards.
func TestRunRejectsBadOutputs(t *testing.T) {
	s, in, out := identitySession(t, Float, []int64{-1})
	_, otherIn, _ := identitySession(t, Float, []int64{-1})
	x, _ := NewTensor([]float32{1, 2}, 2)
	defer x.Close()
	for _, tc := range []struct {
		name    string
		feeds   map[Output]*Tensor
		fetches []Output
		targets []*Operation
		want    string
	}{
		{"feed index past the outputs", map[Output]*Tensor{in.Op.Output(3): x}, []Output{out}, nil, `output in:3: operation "in" (Placeholder) has 1 outputs`},
		{"fetch index past the outputs", map[Output]*Tensor{in: x}, []Output{out, out.Op.Output(1)}, nil, `output out:1: operation "out" (Identity) has 1 outputs`},
		{"negative fetch index", map[Output]*Tensor{in: x}, []Output{out.Op.Output(-1)}, nil, "output out:-1"},
		{"zero Output fed", map[Output]*Tensor{in: x, {}: x}, []Output{out}, nil, "zero Output"},
		{"zero Output fetched", map[Output]*Tensor{in: x}, []Output{{}}, nil, "zero Output"},
		{"nil target", map[Output]*Tensor{in: x}, nil, []*Operation{out.Op, nil}, "target 1 is a nil operation"},
		{"feed of another graph", map[Output]*Tensor{otherIn: x}, []Output{out}, nil, "output in:0 is of another graph"},
		{"target of another graph", map[Output]*Tensor{in: x}, nil, []*Operation{otherIn.Op}, "target in is an operation of another graph"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			outs, err := s.Run(tc.feeds, tc.fetches, tc.targets)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("got %v, %v; want an error containing %q", outs, err, tc.want)
			}
		})
	}
	bad := out.Op.Output(1)
	if dt := bad.DataType(); dt != 0 {
		t.Errorf("DataType of out:1: %s, want 0", dt)
	}
	if _, _, err := bad.Shape(); err == nil || !strings.Contains(err.Error(), "out:1") {
		t.Errorf("Shape of out:1: %v", err)
	}
	if _, _, err := (Output{}).Shape(); err == nil || !strings.Contains(err.Error(), "zero Output") {
		t.Errorf("Shape of a zero Output: %v", err)
	}
	outs, err := s.Run(map[Output]*Tensor{in: x}, []Output{out}, nil)
	if err != nil {
		t.Fatalf("run after the rejected ones: %v", err)
	}
	if v, _ := outs[0].Float32s(); !slices.Equal(v, []float32{1, 2}) {
		t.Errorf("run after the rejected ones: %v", v)
	}
	outs[0].Close()
}

// TestFeedOfAReferenceOutput feeds the output of a TF1 variable that is not a resource, whose
// type is float32_ref: TensorFlow takes a float32 tensor for it, as Python's session.run does.
func TestFeedOfAReferenceOutput(t *testing.T) {
	graphDef := filepath.Join(t.TempDir(), "graph.pb")
	python := testenv.Python(t, `
import json, sys
import tensorflow as tf
g = tf.Graph()
with g.as_default():
    v = tf.compat.v1.Variable([1.0, 2.0], name="v", use_resource=False)
    y = tf.multiply(v, 3.0, name="y")
    with tf.compat.v1.Session() as s:
        print(json.dumps(s.run(y, feed_dict={"v:0": [5.0, 6.0]}).tolist()))
with open(sys.argv[1], "wb") as f:
    f.write(g.as_graph_def().SerializeToString())
`, graphDef)
	var want []float32
	if err := json.Unmarshal(python, &want); err != nil {
		t.Fatalf("%v: %s", err, python)
	}
	b, err := os.ReadFile(graphDef)
	if err != nil {
		t.Fatal(err)
	}
	g := NewGraph()
	defer g.Close()
	if err := g.Import(b, ""); err != nil {
		t.Fatal(err)
	}
	s, err := NewSession(g, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	v, _ := g.Output("v:0")
	y, _ := g.Output("y:0")
	x, _ := NewTensor([]float32{5, 6}, 2)
	defer x.Close()
	outs, err := s.Run(map[Output]*Tensor{v: x}, []Output{y}, nil)
	if err != nil {
		t.Fatalf("feeding %s (%s): %v", v, v.DataType(), err)
	}
	defer outs[0].Close()
	if got, err := outs[0].Float32s(); err != nil || !slices.Equal(got, want) {
		t.Errorf("y = %v, %v; Python %v", got, err, want)
	}
	xInt, _ := NewTensor([]int32{5, 6}, 2)
	defer xInt.Close()
	if _, err := s.Run(map[Output]*Tensor{v: xInt}, []Output{y}, nil); err == nil || !strings.Contains(err.Error(), "got int32[2], the graph wants float32") {
		t.Errorf("feeding int32 to %s: %v", v, err)
	}
}
