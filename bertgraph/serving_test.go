package bertgraph

import (
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"math"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/gorovod/gorovod/tf"

	"github.com/gorovod/gorovod/tf/testenv"
)

func TestInitFromGoogleCheckpointWithMissingNames(t *testing.T) {
	m := loadFixture(t)
	before := m.NewFlatTensors()
	if err := m.ReadVariables(before); err != nil {
		t.Fatal(err)
	}
	report, err := m.InitFromCheckpoint(fixture.Google)
	if err != nil {
		t.Fatal(err)
	}
	missing := []string{"bert/pooler/dense/bias", "output_weights", "output_bias"}
	if got := report.Missing(); !slices.Equal(got, missing) {
		t.Errorf("missing %v, want %v", got, missing)
	}
	if !slices.Equal(report.Unused, []string{"cls/predictions/output_bias"}) {
		t.Errorf("unused %v", report.Unused)
	}
	if n := strings.Count(report.String(), "*INIT_FROM_CKPT*"); n != len(m.Variables())-3 || n != report.Initialized() {
		t.Errorf("%d *INIT_FROM_CKPT* lines for %d variables:\n%s", n, len(m.Variables()), report)
	}
	after := m.NewFlatTensors()
	if err := m.ReadVariables(after); err != nil {
		t.Fatal(err)
	}
	ckpt, err := tf.OpenCheckpoint(fixture.Google)
	if err != nil {
		t.Fatal(err)
	}
	defer ckpt.Close()
	for i, e := range report.Entries {
		if e.From == "" {
			if !slices.Equal(after.Parts[i], before.Parts[i]) {
				t.Errorf("%s is not in the checkpoint but changed", e.Variable)
			}
			continue
		}
		want, err := ckpt.Read(e.From)
		if err != nil {
			t.Fatal(err)
		}
		values, _ := want.Float32s()
		want.Close()
		if e.From != e.Variable || !slices.Equal(after.Parts[i], values) {
			t.Errorf("%s: initialised from %q, values equal: %v", e.Variable, e.From, slices.Equal(after.Parts[i], values))
		}
		if slices.Equal(before.Parts[i], values) && strings.HasSuffix(e.Variable, "kernel") {
			t.Errorf("%s: the checkpoint holds the model's own values; the test proves nothing", e.Variable)
		}
	}

	// Chained fine-tuning: a checkpoint written by Save (Google names) initialises every
	// variable by its Google name, and so does one of the object-based keys gorovod wrote
	// before contract version 3; the optimizer slots and global_step are left unused.
	own := filepath.Join(t.TempDir(), "own.ckpt")
	if _, err := m.Save(own); err != nil {
		t.Fatal(err)
	}
	legacy := filepath.Join(t.TempDir(), "legacy.ckpt")
	if err := m.saveObjectBased(legacy); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		prefix string
		from   func(v VariableSpec) string
	}{
		{own, func(v VariableSpec) string { return v.Name }},
		{legacy, func(v VariableSpec) string { return v.Name + "/.ATTRIBUTES/VARIABLE_VALUE" }},
	} {
		other := loadFixture(t)
		r, err := other.InitFromCheckpoint(c.prefix)
		if err != nil {
			t.Fatal(err)
		}
		got := other.NewFlatTensors()
		if err := other.ReadVariables(got); err != nil {
			t.Fatal(err)
		}
		if r.Initialized() != len(m.Variables()) || !slices.Equal(got.Data, after.Data) {
			t.Errorf("init from %s: %d of %d, values equal: %v", c.prefix, r.Initialized(), len(m.Variables()), slices.Equal(got.Data, after.Data))
		}
		for i, v := range m.Variables() {
			if r.Entries[i].From != c.from(v) {
				t.Errorf("init from %s: %s read from %q, want %q", c.prefix, v.Name, r.Entries[i].From, c.from(v))
			}
		}
		if c.prefix == own && len(r.Unused) != 2*len(m.Variables())+1 {
			t.Errorf("init from %s: %d unused names, want the %d slots and global_step", c.prefix, len(r.Unused), 2*len(m.Variables()))
		}
	}
	if _, err := m.InitFromCheckpoint(filepath.Join(t.TempDir(), "nope.ckpt")); err == nil || !strings.Contains(err.Error(), "nope.ckpt") {
		t.Errorf("init from a missing checkpoint: %v", err)
	}
}

// trained returns the fixture model after a few steps, so exports carry weights that differ
// from the ones the exporter wrote.
func trained(t *testing.T) *Model {
	m := loadFixture(t)
	rng := rand.New(rand.NewPCG(9, 10))
	grads := m.NewFlatTensors()
	for step := range 3 {
		if _, err := m.TrainStep(separableBatch(rng, 8), DropoutSeed{1, int64(step)}, grads); err != nil {
			t.Fatal(err)
		}
		if _, err := m.Apply(grads, 1, 1e-2, 1); err != nil {
			t.Fatal(err)
		}
	}
	return m
}

func TestExportedServingModelPredictsLikeGo(t *testing.T) {
	m := trained(t)
	batch := separableBatch(rand.New(rand.NewPCG(11, 12)), 6)
	goPred, err := m.Predict(batch)
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	export := filepath.Join(dir, "serving")
	if err := m.ExportServing(export, ExportOptions{}); err != nil {
		t.Fatal(err)
	}
	in, _ := json.Marshal(map[string][][]int32{"input_ids": rows(batch.InputIDs, seqLength),
		"input_mask": rows(batch.InputMask, seqLength), "segment_ids": rows(batch.SegmentIDs, seqLength)})
	if err := os.WriteFile(filepath.Join(dir, "batch.json"), in, 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := python("serve", "--model", export, "--input", filepath.Join(dir, "batch.json"), "--out", filepath.Join(dir, "py.json")); err != nil {
		t.Fatal(err)
	}
	var py struct{ Probabilities, Logits [][]float32 }
	b, err := os.ReadFile(filepath.Join(dir, "py.json"))
	if err == nil {
		err = json.Unmarshal(b, &py)
	}
	if err != nil {
		t.Fatal(err)
	}
	for i := range batch.BatchSize {
		for j := range m.NumLabels() {
			if d := math.Abs(float64(py.Logits[i][j] - goPred.Logits[i*2+j])); d > 1e-5 {
				t.Errorf("example %d label %d: Python logit %v, Go %v", i, j, py.Logits[i][j], goPred.Logits[i*2+j])
			}
			if d := math.Abs(float64(py.Probabilities[i][j] - goPred.Row(i)[j])); d > 1e-5 {
				t.Errorf("example %d label %d: Python probability %v, Go %v", i, j, py.Probabilities[i][j], goPred.Row(i)[j])
			}
		}
	}
	// The export carries the trained weights, not the exporter's.
	orig := loadFixture(t)
	origPred, err := orig.Predict(batch)
	if err != nil {
		t.Fatal(err)
	}
	if slices.Equal(origPred.Logits, goPred.Logits) {
		t.Error("training did not change the predictions; the comparison proves nothing")
	}
	cli := exec.Command(testenv.Fixture{Rel: ".venv/bin/saved_model_cli", What: "TensorFlow's saved_model_cli", Target: "make setup"}.Require(t), "show", "--dir", export, "--tag_set", "serve", "--signature_def", "serving_default")
	cli.Env = append(os.Environ(), "TF_CPP_MIN_LOG_LEVEL=3")
	out, err := cli.CombinedOutput()
	if err != nil || !strings.Contains(string(out), "outputs['probabilities']") || !strings.Contains(string(out), "inputs['input_ids']") {
		t.Errorf("saved_model_cli show: %v\n%s", err, out)
	}
	// A second export over the first replaces it (swapped in: the first, marked, goes whole) and
	// leaves nothing beside it.
	marker := filepath.Join(export, "first-export")
	if err := os.WriteFile(marker, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := m.ExportServing(export, ExportOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(marker); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("the first export's file is still there after the second export: %v", err)
	}
	if debris, _ := filepath.Glob(filepath.Join(filepath.Dir(export), ".*.export-*")); debris != nil {
		t.Errorf("staging left beside the export: %v", debris)
	}

	t.Run("Classifier", func(t *testing.T) { testClassifier(t, export, m) })
}

func testClassifier(t *testing.T, dir string, m *Model) {
	c, err := LoadClassifier(dir, ClassifierOptions{MaxBatchSize: 3})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if !slices.Equal(c.Labels(), []string{"neg", "pos"}) {
		t.Errorf("labels %v", c.Labels())
	}
	texts := []string{"w1 w2 w3", "W70 w71 w90 w100", "w5", "w64 w65 unknownword w66", "", "w120 w121 w122 w123 w124 w125 w126 w127 w119 w118 w117 w116 w115 w114 w113"}
	want, err := c.Predict(texts)
	if err != nil {
		t.Fatal(err)
	}
	// Reference: the same texts through the tokenizer, features and the training model's predict.
	ref, err := m.Predict(convert(t, m.VocabPath(), true, texts))
	if err != nil {
		t.Fatal(err)
	}
	for i, p := range want {
		for j, v := range p.Probabilities {
			if math.Abs(float64(v-ref.Row(i)[j])) > 1e-6 {
				t.Errorf("text %d: classifier %v, model %v", i, p.Probabilities, ref.Row(i))
				break
			}
		}
		if p.Label != c.Labels()[p.LabelID] || p.Probabilities[p.LabelID] < p.Probabilities[1-p.LabelID] {
			t.Errorf("text %d: %+v", i, p)
		}
	}
	// Concurrent callers get the sequential answers. Each caller classifies texts[k:] for its k,
	// so the callers run other batch shapes side by side; it is compared with the same call made
	// alone. That comparison is bit for bit: the same session, graph, batch shapes and thread
	// pools pick the same kernels and summation order, whichever goroutine runs them, so any
	// difference is cross-talk between callers. A batch of another shape may round differently
	// (oneDNN picks its blocking by shape and by the CPU's instruction set), so texts[k:] is held
	// to the full batch's answers only within a tolerance.
	const offsets = 3
	alone := make([][]Prediction, offsets)
	for k := range offsets {
		if alone[k], err = c.Predict(texts[k:]); err != nil {
			t.Fatal(err)
		}
		for i, p := range alone[k] {
			for j, v := range p.Probabilities {
				if d := math.Abs(float64(v - want[k+i].Probabilities[j])); d > 1e-5 {
					t.Errorf("texts[%d:] text %d: %v, in the full batch %v (differs by %g, more than rounding on the %s)",
						k, k+i, p.Probabilities, want[k+i].Probabilities, d, testenv.CPU())
					break
				}
			}
		}
	}
	var wg sync.WaitGroup
	errs := make(chan error, 8)
	for g := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			k := g % offsets
			for range 5 {
				got, err := c.Predict(texts[k:])
				if err != nil {
					errs <- err
					return
				}
				for i, p := range got {
					if !slices.Equal(p.Probabilities, alone[k][i].Probabilities) {
						errs <- fmt.Errorf("goroutine %d text %d: %v, alone %v", g, k+i, p.Probabilities, alone[k][i].Probabilities)
						return
					}
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
}

// ExportServing replaces dir: a dir that is, holds or lies inside the model it exports from must
// be refused, not deleted. The model is a private copy, so a regression cannot destroy the
// fixture the other tests share.
func TestExportServingRefusesToReplaceTheModel(t *testing.T) {
	parent := t.TempDir()
	dir := filepath.Join(parent, "model")
	if err := copyTree(fixture.Model, dir); err != nil {
		t.Fatal(err)
	}
	m, err := Load(dir, testOptions())
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	link := filepath.Join(t.TempDir(), "link")
	if err := os.Symlink(dir, link); err != nil {
		t.Fatal(err)
	}
	for name, target := range map[string]string{
		"the model":             dir,
		"the model, unclean":    dir + "/./",
		"relative":              relativeTo(t, dir),
		"its parent":            parent,
		"its serving source":    filepath.Join(dir, m.contract.ServingDir),
		"inside it":             filepath.Join(dir, "variables"),
		"a link to it":          link,
		"inside it, via a link": filepath.Join(link, "export"),
	} {
		err := m.ExportServing(target, ExportOptions{})
		if err == nil || !strings.Contains(err.Error(), "overlaps") {
			t.Errorf("%s (%s): error %v, want a refusal", name, target, err)
		}
		if c, err := ReadContract(dir); err != nil || c.Kind != "training" {
			t.Fatalf("after exporting to %s (%s) the training model is gone: %v", name, target, err)
		}
	}
	// A sibling is fine.
	if err := m.ExportServing(filepath.Join(parent, "serving"), ExportOptions{}); err != nil {
		t.Fatal(err)
	}
}

func relativeTo(t *testing.T, path string) string {
	t.Helper()
	wd, err := os.Getwd()
	if err != nil {
		t.Fatal(err)
	}
	rel, err := filepath.Rel(wd, path)
	if err != nil {
		t.Fatal(err)
	}
	return rel
}
