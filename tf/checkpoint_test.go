package tf

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// TestCheckpointReaderMatchesPython lists and reads checkpoints written by Python (TF2
// tf.train.Checkpoint of every dtype, TF1 Saver with BERT-style names, the SavedModels' own
// variables) and compares with what tf.train.load_checkpoint reports, exactly.
func TestCheckpointReaderMatchesPython(t *testing.T) {
	dir, want := models(t)
	for name, vars := range want.Checkpts {
		t.Run(name, func(t *testing.T) {
			prefix := filepath.Join(dir, name)
			switch name {
			case "tf1_initial", "tf2_initial":
				prefix = filepath.Join(dir, strings.TrimSuffix(name, "_initial"), "variables", "variables")
			}
			r, err := OpenCheckpoint(prefix)
			if err != nil {
				t.Fatal(err)
			}
			defer r.Close()
			got := r.Variables()
			if len(got) != len(vars) {
				t.Fatalf("%d variables, Python %d: %v", len(got), len(vars), got)
			}
			for i, v := range vars {
				if got[i].Name != v.Name || got[i].DType.String() != v.DType || !slices.Equal(got[i].Shape, v.Shape) {
					t.Errorf("variable %d: %s %s %v, Python %s %s %v", i, got[i].Name, got[i].DType, got[i].Shape, v.Name, v.DType, v.Shape)
				}
				if v.Name == "_CHECKPOINTABLE_OBJECT_GRAPH" {
					continue // a serialized proto; its bytes are not canonical across writers
				}
				tensor, err := r.Read(v.Name)
				if err != nil {
					t.Fatal(err)
				}
				if e := encode(t, tensor); !e.equal(v.Value) {
					t.Errorf("%s: %v, Python %v", v.Name, e, v.Value)
				}
				tensor.Close()
			}
		})
	}
}

func TestCheckpointErrors(t *testing.T) {
	dir, _ := models(t)
	missing := filepath.Join(dir, "no_such_ckpt")
	if _, err := OpenCheckpoint(missing); err == nil || !strings.Contains(err.Error(), missing) {
		t.Errorf("open of a missing checkpoint: %v", err)
	}
	// A corrupt index fails at open; a truncated data file fails at read, naming the variable.
	bad := t.TempDir()
	if err := os.WriteFile(filepath.Join(bad, "junk.index"), []byte(strings.Repeat("not an sstable ", 8)), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := OpenCheckpoint(filepath.Join(bad, "junk")); err == nil || !strings.Contains(err.Error(), "junk") {
		t.Errorf("open of a corrupt index: %v", err)
	}
	for _, suffix := range []string{".index", ".data-00000-of-00001"} {
		b, err := os.ReadFile(filepath.Join(dir, "ckpt_tf1"+suffix))
		if err != nil {
			t.Fatal(err)
		}
		if suffix != ".index" {
			b = b[:len(b)/2]
		}
		if err := os.WriteFile(filepath.Join(bad, "truncated"+suffix), b, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	truncated, err := OpenCheckpoint(filepath.Join(bad, "truncated"))
	if err != nil {
		t.Fatal(err)
	}
	defer truncated.Close()
	const last = "output_bias" // stored last, so past the cut
	if _, err := truncated.Read(last); err == nil || !strings.Contains(err.Error(), "read "+last) {
		t.Errorf("read past the end of a truncated data file: %v", err)
	}

	// Verification finds the truncation before a restore would, naming the file; complete
	// checkpoints (TF1 and TF2, with its object graph) pass it.
	if err := VerifyCheckpoint(filepath.Join(bad, "truncated")); err == nil ||
		!strings.Contains(err.Error(), filepath.Join(bad, "truncated.data-00000-of-00001")+" is damaged") {
		t.Errorf("verifying a truncated checkpoint: %v", err)
	}
	for _, sound := range []string{"ckpt_tf1", "ckpt_tf2"} {
		if err := VerifyCheckpoint(filepath.Join(dir, sound)); err != nil {
			t.Errorf("verifying %s: %v", sound, err)
		}
	}
	if err := VerifyCheckpoint(filepath.Join(bad, "junk")); err == nil || !strings.Contains(err.Error(), "junk.index is damaged") {
		t.Errorf("verifying a corrupt index: %v", err)
	}

	r, err := OpenCheckpoint(filepath.Join(dir, "ckpt_tf1"))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := r.Read("bert/nope"); err == nil || !strings.Contains(err.Error(), `"bert/nope"`) {
		t.Errorf("read of a missing variable: %v", err)
	}
	r.Close()
	r.Close()
	if _, err := r.Read("output_bias"); err == nil || !strings.Contains(err.Error(), "closed") {
		t.Errorf("read after close: %v", err)
	}
}

// readAll reads every variable of a checkpoint except the object graph.
func readAll(t *testing.T, prefix string) map[string]encodedTensor {
	t.Helper()
	r, err := OpenCheckpoint(prefix)
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	out := map[string]encodedTensor{}
	for _, v := range r.Variables() {
		if v.Name == "_CHECKPOINTABLE_OBJECT_GRAPH" {
			continue
		}
		tensor, err := r.Read(v.Name)
		if err != nil {
			t.Fatal(err)
		}
		out[v.Name] = encode(t, tensor)
		tensor.Close()
	}
	return out
}

func runPredict(t *testing.T, m *SavedModel, sig string, x *Tensor) encodedTensor {
	t.Helper()
	outs, err := m.RunSignature(sig, map[string]*Tensor{"x": x}, "logits")
	if err != nil {
		t.Fatal(err)
	}
	defer outs[0].Close()
	return encode(t, outs[0])
}

// TestSaveRestoreRoundTrip saves through the SaverDef, trains (which changes the variables),
// restores, and checks the variables and predictions come back exactly; the saved values are
// the initial ones Python wrote into the SavedModel.
func TestSaveRestoreRoundTrip(t *testing.T) {
	_, want := models(t)
	for _, tc := range []struct{ model, predict string }{{"tf1", "serving_default"}, {"tf2", "predict"}} {
		t.Run(tc.model, func(t *testing.T) {
			m := load(t, tc.model)
			calls := want.TF2Calls
			if tc.model == "tf1" {
				calls = want.TF1Calls
			}
			x := calls[0].Inputs["x"].toTensor(t)
			defer x.Close()
			before := runPredict(t, m, tc.predict, x)

			prefix := filepath.Join(t.TempDir(), "ckpt")
			written, err := m.Save(prefix)
			if err != nil {
				t.Fatal(err)
			}
			if written != prefix {
				t.Errorf("Save wrote %q, asked %q", written, prefix)
			}
			saved := readAll(t, prefix)
			for _, v := range want.Checkpts[tc.model+"_initial"] {
				if v.Name == "_CHECKPOINTABLE_OBJECT_GRAPH" {
					continue
				}
				if !saved[v.Name].equal(v.Value) {
					t.Errorf("saved %s = %v, Python's initial value %v", v.Name, saved[v.Name], v.Value)
				}
			}

			train := calls[1]
			inputs := map[string]*Tensor{}
			for k, e := range train.Inputs {
				inputs[k] = e.toTensor(t)
				defer inputs[k].Close()
			}
			outs, err := m.RunSignature("train", inputs)
			if err != nil {
				t.Fatal(err)
			}
			for _, o := range outs {
				o.Close()
			}
			if runPredict(t, m, tc.predict, x).equal(before) {
				t.Fatal("a train step left the predictions unchanged; the round trip would prove nothing")
			}

			if err := m.Restore(prefix); err != nil {
				t.Fatal(err)
			}
			if after := runPredict(t, m, tc.predict, x); !after.equal(before) {
				t.Errorf("after restore: %v, before save: %v", after, before)
			}
			again := filepath.Join(t.TempDir(), "again")
			if _, err := m.Save(again); err != nil {
				t.Fatal(err)
			}
			resaved := readAll(t, again)
			if len(resaved) != len(saved) {
				t.Errorf("re-saved %d variables, saved %d", len(resaved), len(saved))
			}
			for name, v := range saved {
				if !resaved[name].equal(v) {
					t.Errorf("%s: re-saved %v, saved %v", name, resaved[name], v)
				}
			}
		})
	}
}

// TestRestorePythonTrainedCheckpoint restores the checkpoint Python wrote after its train
// steps into a fresh load, and predicts what Python predicted after them.
func TestRestorePythonTrainedCheckpoint(t *testing.T) {
	dir, want := models(t)
	for _, tc := range []struct {
		model, predict string
		after          expectedCall
	}{{"tf1", "serving_default", want.TF1Calls[3]}, {"tf2", "predict", want.TF2Calls[3]}} {
		t.Run(tc.model, func(t *testing.T) {
			m := load(t, tc.model)
			if err := m.Restore(filepath.Join(dir, tc.model+"_trained")); err != nil {
				t.Fatal(err)
			}
			x := tc.after.Inputs["x"].toTensor(t)
			defer x.Close()
			if got := runPredict(t, m, tc.predict, x); !got.equal(tc.after.Outputs["logits"]) {
				t.Errorf("logits %v, Python after training %v", got, tc.after.Outputs["logits"])
			}
		})
	}
}

func TestRestoreMissingCheckpoint(t *testing.T) {
	m := load(t, "tf2")
	missing := filepath.Join(t.TempDir(), "never_saved")
	err := m.Restore(missing)
	if err == nil || !strings.Contains(err.Error(), missing) {
		t.Fatalf("restore of a missing checkpoint: %v", err)
	}
	t.Log(err)
}

// TestCheckpointVariableInfoIsACopy changes the shapes Variable and Variables return: the
// reader's own, checked against Python's, must not change with them.
func TestCheckpointVariableInfoIsACopy(t *testing.T) {
	dir, want := models(t)
	r, err := OpenCheckpoint(filepath.Join(dir, "tf1", "variables", "variables"))
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	var checked int
	for _, v := range want.Checkpts["tf1_initial"] {
		if len(v.Shape) == 0 {
			continue
		}
		got, ok := r.Variable(v.Name)
		if !ok || !slices.Equal(got.Shape, v.Shape) {
			t.Fatalf("Variable(%q) = %v %v, Python's shape %v", v.Name, got, ok, v.Shape)
		}
		got.Shape[0] = -7
		for _, all := range r.Variables() {
			if all.Name == v.Name {
				all.Shape[0] = -8
			}
		}
		if again, _ := r.Variable(v.Name); !slices.Equal(again.Shape, v.Shape) {
			t.Errorf("%s: shape %v after the caller changed a returned one, Python's %v", v.Name, again.Shape, v.Shape)
		}
		checked++
	}
	if checked == 0 {
		t.Fatal("the checkpoint has no variable with dimensions to check")
	}
}
