package bertgraph

import (
	"encoding/json"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// initCheckpoints has Python write checkpoints that do not fit the fixture model: one holding
// only a name of another convention, one with every variable's shape off by one, one fitting
// but with 30 names the model does not have. It returns their prefixes by those names.
func initCheckpoints(t *testing.T) map[string]string {
	t.Helper()
	dir := t.TempDir()
	const script = `
import json, sys
import numpy as np
from bertgraph.exporter import checkpoint, contract
model, out = sys.argv[1], sys.argv[2]
variables = contract.read(model)["variables"]
checkpoint.write(out + "/foreign.ckpt", {"encoder/layer_0/foo": np.zeros([3], np.float32)})
checkpoint.write(out + "/shapes.ckpt", {v["name"]: np.zeros([d + 1 for d in v["shape"]], np.float32) for v in variables})
fits = {v["name"]: np.full(v["shape"], 0.5, np.float32) for v in variables}
fits.update({"extra/name_%02d" % i: np.zeros([2], np.float32) for i in range(30)})
checkpoint.write(out + "/extra.ckpt", fits)
`
	if _, err := venvPython("-c", script, fixture.Model, dir); err != nil {
		t.Fatal(err)
	}
	out := map[string]string{}
	for _, name := range []string{"foreign", "shapes", "extra"} {
		out[name] = filepath.Join(dir, name+".ckpt")
	}
	return out
}

func TestInitCheckpointThatDoesNotFitIsRefusedBeforeAnyChange(t *testing.T) {
	m := loadFixture(t)
	ckpts := initCheckpoints(t)
	before := m.NewFlatTensors()
	if err := m.ReadVariables(before); err != nil {
		t.Fatal(err)
	}
	n := len(m.Variables())
	for name, want := range map[string][]string{
		// Names of another convention: nothing of the encoder would be initialised.
		"foreign": {ckpts["foreign"], "initialises none of the model's", "encoder/layer_0/foo",
			"bert/embeddings/word_embeddings", "/.ATTRIBUTES/VARIABLE_VALUE"},
		// Every shape wrong: the first 10 are named, the rest counted.
		"shapes": {ckpts["shapes"], fmt.Sprintf("%d variable(s) differ in shape or dtype", n),
			"bert/embeddings/word_embeddings is float32[129 33] in the checkpoint, the model's bert/embeddings/word_embeddings is float32[128 32]",
			fmt.Sprintf("... and %d more", n-10)},
	} {
		_, checkErr := m.Contract().CheckInitCheckpoint(ckpts[name])
		_, initErr := m.InitFromCheckpoint(ckpts[name])
		for _, err := range []error{checkErr, initErr} {
			if err == nil {
				t.Fatalf("%s: no error", name)
			}
			for _, w := range want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("%s: error lacks %q:\n%v", name, w, err)
				}
			}
			if lines := strings.Count(err.Error(), "\n"); lines > 11 {
				t.Errorf("%s: the error has %d lines:\n%v", name, lines+1, err)
			}
		}
	}
	after := m.NewFlatTensors()
	if err := m.ReadVariables(after); err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(before.Data, after.Data) {
		t.Error("a refused init checkpoint changed the model's variables")
	}
}

// CheckInitCheckpoint reads the index alone: without the data file it still plans, and the plan
// is what InitFromCheckpoint then does. The report lists the unused names, capped.
func TestCheckInitCheckpointReadsOnlyTheIndexAndReportsUnusedNames(t *testing.T) {
	m := loadFixture(t)
	prefix := initCheckpoints(t)["extra"]
	full, err := m.InitFromCheckpoint(prefix)
	if err != nil {
		t.Fatal(err)
	}
	data, err := filepath.Glob(prefix + ".data-*")
	if err != nil || len(data) == 0 {
		t.Fatalf("no data file beside %s: %v", prefix, err)
	}
	for _, f := range data {
		if err := os.Remove(f); err != nil {
			t.Fatal(err)
		}
	}
	plan, err := m.Contract().CheckInitCheckpoint(prefix)
	if err != nil {
		t.Fatalf("check without the data file: %v", err)
	}
	if fmt.Sprint(plan.Entries) != fmt.Sprint(full.Entries) {
		t.Errorf("plan %v, init did %v", plan.Entries, full.Entries)
	}
	if _, err := m.InitFromCheckpoint(prefix); err == nil {
		t.Error("init without the data file succeeded: the test's premise is wrong")
	}
	if plan.Initialized() != len(m.Variables()) || len(plan.Unused) != 30 {
		t.Fatalf("plan initialises %d of %d, %d unused", plan.Initialized(), len(m.Variables()), len(plan.Unused))
	}
	s := plan.String()
	for _, want := range []string{"**** Unused checkpoint names **** (30)", "  name = extra/name_00\n", "  name = extra/name_19\n", "  ... and 10 more\n"} {
		if !strings.Contains(s, want) {
			t.Errorf("report lacks %q:\n%s", want, s)
		}
	}
	if strings.Contains(s, "extra/name_20") {
		t.Errorf("report lists more than 20 unused names:\n%s", s)
	}
}

// savedAfterSteps returns a model moved by a few updates (non-zero slots, global step 3) and the
// checkpoint Save wrote of it.
func savedAfterSteps(t *testing.T) (*Model, string) {
	t.Helper()
	m := trained(t)
	prefix := filepath.Join(t.TempDir(), "model.ckpt-3")
	if _, err := m.Save(prefix); err != nil {
		t.Fatal(err)
	}
	return m, prefix
}

// An independent reader: Python TensorFlow's tf.train.load_checkpoint reads what Go wrote under
// Google BERT's names, those run_classifier's AdamWeightDecayOptimizer gives its slots
// (<name>/adam_m, <name>/adam_v) and global_step, and the values are Go's.
func TestSavedCheckpointIsReadByTensorFlowUnderGoogleNames(t *testing.T) {
	m, prefix := savedAfterSteps(t)
	const script = `
import json, sys
import tensorflow as tf
r = tf.train.load_checkpoint(sys.argv[1])
dtypes = r.get_variable_to_dtype_map()
json.dump({"dtypes": {n: d.name for n, d in dtypes.items()},
           "values": {n: r.get_tensor(n).ravel().tolist() for n in dtypes if n != "global_step"},
           "global_step": int(r.get_tensor("global_step"))}, sys.stdout)
`
	out, err := venvPython("-c", script, prefix)
	if err != nil {
		t.Fatal(err)
	}
	var py struct {
		DTypes     map[string]string    `json:"dtypes"`
		Values     map[string][]float64 `json:"values"`
		GlobalStep int64                `json:"global_step"`
	}
	if err := json.Unmarshal(out, &py); err != nil {
		t.Fatal(err)
	}
	want := map[string]string{"global_step": "int64"}
	for _, v := range m.Variables() {
		for _, name := range []string{v.Name, v.Name + "/adam_m", v.Name + "/adam_v"} {
			want[name] = "float32"
		}
	}
	if !maps.Equal(py.DTypes, want) {
		t.Errorf("the checkpoint holds %d names, want %d (the variables, their adam_m and adam_v, global_step)", len(py.DTypes), len(want))
		for name := range want {
			if py.DTypes[name] != want[name] {
				t.Errorf("  %s: %q in the checkpoint, want %q", name, py.DTypes[name], want[name])
			}
		}
	}
	values := m.NewFlatTensors()
	if err := m.ReadVariables(values); err != nil {
		t.Fatal(err)
	}
	for i, v := range m.Variables() {
		got := make([]float32, len(py.Values[v.Name]))
		for j, x := range py.Values[v.Name] {
			got[j] = float32(x)
		}
		if !slices.Equal(got, values.Parts[i]) {
			t.Errorf("%s: Python reads other values than Go's", v.Name)
		}
	}
	if step, err := m.GlobalStep(); err != nil || py.GlobalStep != step || step != 3 {
		t.Errorf("global_step: Python %d, Go %d (%v), want 3", py.GlobalStep, step, err)
	}
	if moved := slices.ContainsFunc(py.Values["output_weights/adam_v"], func(x float64) bool { return x != 0 }); !moved {
		t.Error("output_weights/adam_v is all zeros after 3 steps: the slots were not saved")
	}
}

// Restore refuses, naming the file and the keys, and before changing anything, a checkpoint
// lacking a key, one with a key of another shape or dtype, and one without its data; and it
// says how to go on from a checkpoint of the object-based keys of contract version 2 and older.
func TestRestoreRefusesCheckpointsThatDoNotFit(t *testing.T) {
	src, good := savedAfterSteps(t)
	dir := t.TempDir()
	const script = `
import sys
import numpy as np
from bertgraph.exporter import checkpoint
good, out = sys.argv[1], sys.argv[2]
values = checkpoint.read(good)
checkpoint.write(out + "/missing.ckpt", {k: v for k, v in values.items() if k != "output_bias/adam_v"})
checkpoint.write(out + "/shape.ckpt", dict(values, output_bias=np.zeros([5], np.float32)))
checkpoint.write(out + "/dtype.ckpt", dict(values, global_step=np.float32(3)))
checkpoint.write(out + "/nodata.ckpt", values)
`
	if _, err := venvPython("-c", script, good, dir); err != nil {
		t.Fatal(err)
	}
	nodata := filepath.Join(dir, "nodata.ckpt")
	data, err := filepath.Glob(nodata + ".data-*")
	if err != nil || len(data) != 1 {
		t.Fatalf("data files of %s: %v %v", nodata, data, err)
	}
	if err := os.Remove(data[0]); err != nil {
		t.Fatal(err)
	}
	legacy := filepath.Join(dir, "legacy.ckpt")
	if err := src.saveObjectBased(legacy); err != nil {
		t.Fatal(err)
	}
	m := loadFixture(t)
	before := m.NewFlatTensors()
	if err := m.ReadVariables(before); err != nil {
		t.Fatal(err)
	}
	for name, want := range map[string][]string{
		"missing.ckpt": {"1 of the", "missing: output_bias/adam_v"},
		"shape.ckpt":   {"output_bias is float32[5] in the checkpoint, the model's variable output_bias is float32[2]"},
		"dtype.ckpt":   {"global_step is float32[] in the checkpoint, the model's global_step is int64[]"},
		"nodata.ckpt":  {"restore checkpoint"},
		"legacy.ckpt": {"keyed the old way", "bert/embeddings/word_embeddings/.ATTRIBUTES/VARIABLE_VALUE",
			"--init_checkpoint=" + legacy},
	} {
		prefix := filepath.Join(dir, name)
		err := m.Restore(prefix)
		if err == nil {
			t.Fatalf("%s: restored", name)
		}
		for _, w := range append(want, prefix) {
			if !strings.Contains(err.Error(), w) {
				t.Errorf("%s: the error lacks %q:\n%v", name, w, err)
			}
		}
	}
	after := m.NewFlatTensors()
	if err := m.ReadVariables(after); err != nil {
		t.Fatal(err)
	}
	if step, err := m.GlobalStep(); err != nil || step != 0 || !slices.Equal(before.Data, after.Data) {
		t.Errorf("refused restores changed the model: global step %d (%v), variables equal: %v", step, err, slices.Equal(before.Data, after.Data))
	}
	// The good one restores.
	if err := m.Restore(good); err != nil {
		t.Fatal(err)
	}
	if step, err := m.GlobalStep(); err != nil || step != 3 {
		t.Errorf("global step %d (%v) after restoring %s, want 3", step, err, good)
	}
}

// A fine-tuned checkpoint's optimizer state is expected when chaining fine-tuning: String sums
// it up in one line and lists only the other unused names.
func TestInitReportSummarisesOptimizerState(t *testing.T) {
	r := InitReport{Checkpoint: "out/model.ckpt-10", Unused: []string{"global_step"}}
	for i := range 41 {
		r.Unused = append(r.Unused, fmt.Sprintf("bert/layer_%d/kernel/adam_m", i), fmt.Sprintf("bert/layer_%d/kernel/adam_v", i))
	}
	r.Unused = append(r.Unused, "cls/predictions/output_bias")
	s := r.String()
	for _, want := range []string{
		"**** Unused checkpoint names **** (84)\n",
		"  82 optimizer slots (*/adam_m, */adam_v) and global_step: the optimizer state of a training checkpoint, not model variables\n",
		"  name = cls/predictions/output_bias\n",
	} {
		if !strings.Contains(s, want) {
			t.Errorf("report lacks %q:\n%s", want, s)
		}
	}
	if strings.Contains(s, "adam_m\n") || strings.Contains(s, "name = global_step") || strings.Contains(s, "more") {
		t.Errorf("report lists the optimizer state by name:\n%s", s)
	}
	if lines := strings.Count(s, "\n"); lines != 4 {
		t.Errorf("report has %d lines, want 4:\n%s", lines, s)
	}
	r.Unused = []string{"global_step"}
	if s := r.String(); !strings.Contains(s, "  global_step: the optimizer state") {
		t.Errorf("global_step alone:\n%s", s)
	}
}
