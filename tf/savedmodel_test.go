package tf

import (
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// oneThread matches the Python reference run, so reductions add in the same order.
var oneThread = &SessionOptions{IntraOpThreads: 1, InterOpThreads: 1}

func load(t testing.TB, model string) *SavedModel {
	t.Helper()
	dir, _ := models(t)
	m, err := LoadSavedModel(filepath.Join(dir, model), []string{"serve"}, oneThread)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := m.Close(); err != nil {
			t.Error(err)
		}
	})
	return m
}

func TestSignaturesAndSaverDefMatchPython(t *testing.T) {
	_, want := models(t)
	for _, model := range []string{"tf1", "tf2"} {
		t.Run(model, func(t *testing.T) {
			m := load(t, model)
			exp := want.MetaGraphs[model]
			if !slices.Equal(m.Tags, exp.Tags) {
				t.Errorf("tags %v, Python %v", m.Tags, exp.Tags)
			}
			var keys []string
			for k := range exp.Signatures {
				keys = append(keys, k)
			}
			slices.Sort(keys)
			var got []string
			for _, s := range m.Signatures {
				got = append(got, s.Key)
			}
			if !slices.Equal(got, keys) {
				t.Fatalf("signatures %v, Python %v", got, keys)
			}
			for _, sig := range m.Signatures {
				e := exp.Signatures[sig.Key]
				if sig.MethodName != e.Method {
					t.Errorf("%s: method %q, Python %q", sig.Key, sig.MethodName, e.Method)
				}
				checkInfos(t, sig.Key+" inputs", sig.Inputs, e.Inputs)
				checkInfos(t, sig.Key+" outputs", sig.Outputs, e.Outputs)
			}
			sd := exp.SaverDef
			wantSaver := SaverDef{sd.FilenameTensor, sd.SaveTensor, sd.RestoreOp, sd.MaxToKeep, sd.Sharded, sd.Version}
			if m.SaverDef == nil || *m.SaverDef != wantSaver {
				t.Errorf("SaverDef %+v, Python %+v", m.SaverDef, wantSaver)
			}
		})
	}
}

func checkInfos(t *testing.T, what string, got []TensorInfo, want map[string]expectedTensorInfo) {
	t.Helper()
	if len(got) != len(want) {
		t.Errorf("%s: %d, Python has %d", what, len(got), len(want))
	}
	for i, info := range got {
		if i > 0 && got[i-1].Key >= info.Key {
			t.Errorf("%s: not sorted by key: %q before %q", what, got[i-1].Key, info.Key)
		}
		e, ok := want[info.Key]
		if !ok {
			t.Errorf("%s: key %q not in Python's signature", what, info.Key)
			continue
		}
		shapeOK := e.Shape == nil && info.Shape.UnknownRank ||
			e.Shape != nil && !info.Shape.UnknownRank && slices.Equal(info.Shape.Dims, e.Shape)
		if info.Name != e.Name || int32(info.DType) != e.DTypeEnum || info.DType.String() != e.DType || !shapeOK {
			t.Errorf("%s %q: got %s %s %s, Python %s %s %v", what, info.Key, info.Name, info.DType, info.Shape, e.Name, e.DType, e.Shape)
		}
	}
}

// TestSignatureResultsMatchPython replays, on a fresh load in Go, the calls Python made on a
// fresh load (including the stateful train steps in between), and compares every output
// exactly.
func TestSignatureResultsMatchPython(t *testing.T) {
	_, want := models(t)
	for model, calls := range map[string][]expectedCall{"tf1": want.TF1Calls, "tf2": want.TF2Calls} {
		t.Run(model, func(t *testing.T) {
			m := load(t, model)
			called := map[string]bool{}
			for _, call := range calls {
				called[call.Signature] = true
			}
			for _, sig := range m.Signatures {
				if !called[sig.Key] {
					t.Errorf("signature %q is not in Python's reference calls", sig.Key)
				}
			}
			for i, call := range calls {
				inputs := map[string]*Tensor{}
				for k, e := range call.Inputs {
					inputs[k] = e.toTensor(t)
					defer inputs[k].Close()
				}
				sig, err := m.Signature(call.Signature)
				if err != nil {
					t.Fatal(err)
				}
				outs, err := m.RunSignature(call.Signature, inputs)
				if err != nil {
					t.Fatalf("call %d: %v", i, err)
				}
				if len(outs) != len(call.Outputs) {
					t.Fatalf("call %d %s: %d outputs, Python %d", i, call.Signature, len(outs), len(call.Outputs))
				}
				for j, out := range outs {
					key := sig.Outputs[j].Key
					if got, exp := encode(t, out), call.Outputs[key]; !got.equal(exp) {
						t.Errorf("call %d %s output %q:\n got    %v\n Python %v", i, call.Signature, key, got, exp)
					}
					out.Close()
				}
			}
		})
	}
}

func TestRunSignatureSelectsOutputsInOrder(t *testing.T) {
	m := load(t, "tf2")
	_, want := models(t)
	call := want.TF2Calls[0] // predict on the initial weights
	x := call.Inputs["x"].toTensor(t)
	defer x.Close()
	outs, err := m.RunSignature("predict", map[string]*Tensor{"x": x}, "probs", "label")
	if err != nil {
		t.Fatal(err)
	}
	for i, key := range []string{"probs", "label"} {
		if got := encode(t, outs[i]); !got.equal(call.Outputs[key]) {
			t.Errorf("output %d (%s): got %v, Python %v", i, key, got, call.Outputs[key])
		}
		outs[i].Close()
	}
}

func TestLoadSavedModelErrors(t *testing.T) {
	dir, _ := models(t)
	corrupt := t.TempDir()
	if err := os.WriteFile(filepath.Join(corrupt, "saved_model.pb"), []byte("this is not a protobuf \xff\xff\xff"), 0o644); err != nil {
		t.Fatal(err)
	}
	truncated := t.TempDir()
	pb, err := os.ReadFile(filepath.Join(dir, "tf2", "saved_model.pb"))
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(truncated, "saved_model.pb"), pb[:len(pb)/2], 0o644); err != nil {
		t.Fatal(err)
	}
	// A SavedModel whose variables file is cut short: the error names that file, and not the
	// tag sets, which are fine.
	damaged := filepath.Join(t.TempDir(), "damaged")
	if err := os.CopyFS(damaged, os.DirFS(filepath.Join(dir, "tf2"))); err != nil {
		t.Fatal(err)
	}
	data := filepath.Join(damaged, "variables", "variables.data-00000-of-00001")
	if st, err := os.Stat(data); err != nil || os.Truncate(data, st.Size()/2) != nil {
		t.Fatalf("truncating %s: %v", data, err)
	}
	// SavedModels whose variables directory is gone (a copy of saved_model.pb alone): TensorFlow's
	// C++ loader would load them without their variables, Python's fails.
	noVariables := map[string]string{}
	for _, model := range []string{"tf1", "tf2"} {
		noVariables[model] = filepath.Join(t.TempDir(), model)
		if err := os.CopyFS(noVariables[model], os.DirFS(filepath.Join(dir, model))); err != nil {
			t.Fatal(err)
		}
		if err := os.RemoveAll(filepath.Join(noVariables[model], "variables")); err != nil {
			t.Fatal(err)
		}
	}
	for _, tc := range []struct {
		name, dir string
		tags      []string
		want      []string // all must appear in the message
		not       string   // must not appear
	}{
		{"missing directory", filepath.Join(dir, "nope"), []string{"serve"}, []string{filepath.Join(dir, "nope"), "no such file"}, ""},
		{"wrong tag", filepath.Join(dir, "tf2"), []string{"train"}, []string{filepath.Join(dir, "tf2"), "train", "NOT_FOUND", "has tag sets [serve]"}, ""},
		{"corrupt saved_model.pb", corrupt, []string{"serve"}, []string{corrupt, "saved_model.pb is not a SavedModel protobuf"}, ""},
		{"truncated saved_model.pb", truncated, []string{"serve"}, []string{truncated, "saved_model.pb is not a SavedModel protobuf"}, ""},
		{"no variables (TF1)", noVariables["tf1"], []string{"serve"}, []string{filepath.Join(noVariables["tf1"], "variables", "variables.index"), "SaverDef"}, ""},
		{"no variables (TF2)", noVariables["tf2"], []string{"serve"}, []string{filepath.Join(noVariables["tf2"], "variables", "variables.index"), "SaverDef"}, ""},
		{"truncated variables", damaged, []string{"serve"}, []string{data + " is damaged", "OUT_OF_RANGE"}, "tag sets"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			m, err := LoadSavedModel(tc.dir, tc.tags, nil)
			if err == nil {
				m.Close()
				t.Fatal("loaded")
			}
			for _, w := range tc.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q does not mention %q", err, w)
				}
			}
			if tc.not != "" && strings.Contains(err.Error(), tc.not) {
				t.Errorf("error %q mentions %q", err, tc.not)
			}
		})
	}
}

func TestRunSignatureErrors(t *testing.T) {
	m := load(t, "tf2")
	x, _ := NewTensor(make([]float32, 8), 2, 4)
	y, _ := NewTensor([]int32{0, 1}, 2)
	lr, _ := NewTensor([]float32{0.1})
	xInt, _ := NewTensor(make([]int32, 8), 2, 4)
	xWide, _ := NewTensor(make([]float32, 10), 2, 5)
	xFlat, _ := NewTensor(make([]float32, 8), 8)
	lrVec, _ := NewTensor([]float32{0.1}, 1)
	for _, tensor := range []*Tensor{x, y, lr, xInt, xWide, xFlat, lrVec} {
		defer tensor.Close()
	}
	for _, tc := range []struct {
		name, sig string
		inputs    map[string]*Tensor
		outputs   []string
		want      []string
	}{
		{"unknown signature", "nope", map[string]*Tensor{"x": x}, nil, []string{`no signature "nope"`, "predict, train"}},
		{"unknown input key", "predict", map[string]*Tensor{"x": x, "z": x}, nil, []string{`no input "z"`, "predict"}},
		{"missing input", "train", map[string]*Tensor{"x": x, "y": y}, nil, []string{`input "lr" not given`}},
		{"unknown output key", "predict", map[string]*Tensor{"x": x}, []string{"logits", "loss"}, []string{`no output "loss"`, "label, logits, probs"}},
		{"wrong dtype", "predict", map[string]*Tensor{"x": xInt}, nil, []string{`input "x"`, "predict_x:0", "int32", "float32"}},
		{"wrong dimension", "predict", map[string]*Tensor{"x": xWide}, nil, []string{`input "x"`, "predict_x:0", "[2,5]", "[?,4]"}},
		{"wrong rank", "predict", map[string]*Tensor{"x": xFlat}, nil, []string{`input "x"`, "predict_x:0", "[8]", "[?,4]"}},
		{"scalar fed a vector", "train", map[string]*Tensor{"x": x, "y": y, "lr": lrVec}, nil, []string{`input "lr"`, "train_lr:0", "[1]", "[]"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			outs, err := m.RunSignature(tc.sig, tc.inputs, tc.outputs...)
			if err == nil {
				t.Fatalf("ran: %v", outs)
			}
			for _, w := range tc.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q does not mention %q", err, w)
				}
			}
		})
	}
	// TensorFlow's own errors come back as *Error with the signature as context.
	yBad, _ := NewTensor([]int32{0, 7}, 2) // label out of range for 3 classes
	defer yBad.Close()
	_, err := m.RunSignature("train", map[string]*Tensor{"x": x, "y": yBad, "lr": lr})
	var tfErr *Error
	if !errors.As(err, &tfErr) || tfErr.Code != CodeInvalidArgument || !strings.Contains(err.Error(), `signature "train"`) {
		t.Errorf("out-of-range label: got %v, want an INVALID_ARGUMENT *Error naming the signature", err)
	}
}
