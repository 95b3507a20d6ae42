package bertgraph

import (
	"fmt"
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
