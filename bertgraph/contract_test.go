package bertgraph

import (
	"encoding/json"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"testing"

	"github.com/gorovod/gorovod/bertgraph/features"
)

// copyModel copies the fixture SavedModel and lets edit rewrite its contract.
func copyModel(t *testing.T, edit func(c map[string]any)) string {
	t.Helper()
	dir := filepath.Join(t.TempDir(), "model")
	if err := copyTree(fixture.Model, dir); err != nil {
		t.Fatal(err)
	}
	editContract(t, dir, edit)
	return dir
}

// editContract lets edit rewrite the contract of the SavedModel in dir.
func editContract(t *testing.T, dir string, edit func(c map[string]any)) {
	t.Helper()
	path := filepath.Join(dir, ContractFile)
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var c map[string]any
	if err := json.Unmarshal(b, &c); err != nil {
		t.Fatal(err)
	}
	edit(c)
	if b, err = json.Marshal(c); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, b, 0o644); err != nil {
		t.Fatal(err)
	}
}

func TestLoadRejectsWrongOrIncompleteModels(t *testing.T) {
	empty := t.TempDir()
	serving := filepath.Join(fixture.Model, "assets.extra", "serving")
	noGraph := copyModel(t, func(map[string]any) {})
	if err := os.Remove(filepath.Join(noGraph, "saved_model.pb")); err != nil {
		t.Fatal(err)
	}
	// The serving model carries serving_default only: with the training contract it lacks the rest.
	trainingContractOnServingModel := filepath.Join(t.TempDir(), "serving")
	if err := copyTree(serving, trainingContractOnServingModel); err != nil {
		t.Fatal(err)
	}
	if err := copyFile(filepath.Join(fixture.Model, ContractFile), filepath.Join(trainingContractOnServingModel, ContractFile)); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name, dir string
		want      []string
	}{
		{"no contract", empty, []string{empty, "not a gorovod BERT SavedModel", "gorovod_contract.json"}},
		{"contract version", copyModel(t, func(c map[string]any) { c["contract_version"] = 99.0 }),
			[]string{"contract version 99", "version 4", "re-export"}},
		{"contract version 1 (no gradient_scale)", copyModel(t, func(c map[string]any) { c["contract_version"] = 1.0 }),
			[]string{"contract version 1", "apply_gradients takes the input gradient_scale", "since version 3, training checkpoints", "re-export"}},
		{"contract version 2 (object-based checkpoints)", copyModel(t, func(c map[string]any) { c["contract_version"] = 2.0 }),
			[]string{"contract version 2", "since version 3, training checkpoints are written and read by save_checkpoint and restore_checkpoint, keyed by Google BERT names", "re-export"}},
		{"contract version 3 (no mixed precision)", copyModel(t, func(c map[string]any) { c["contract_version"] = 3.0 }),
			[]string{"contract version 3", "since version 4, train_step has bfloat16 and float16 variants and apply_gradients keeps a loss scale (--amp)", "re-export"}},
		{"serving model", serving, []string{"serving", "LoadClassifier"}},
		{"no saved_model.pb", noGraph, []string{"saved_model.pb"}},
		{"variable without gradient", copyModel(t, func(c map[string]any) {
			vars := c["variables"].([]any)
			c["variables"] = vars[:len(vars)-1]
		}), []string{"train_step has 41 gradient outputs for 40 variables", `signature "apply_gradients" has 44 inputs, want 43`,
			"the optimizer has 82 slots for 40 variables"}},
		{"wrong max_seq_length", copyModel(t, func(c map[string]any) { c["max_seq_length"] = 32.0 }),
			[]string{`signature "train_step" input "input_ids" has shape [?,16], want [?,32]`, `signature "predict"`}},
		{"shape of a variable", copyModel(t, func(c map[string]any) {
			v := c["variables"].([]any)[0].(map[string]any)
			v["shape"] = []any{127.0, 32.0}
		}), []string{`signature "train_step" output "grad_0000" has shape [128,32], want [127,32]`}},
		{"bert_config without vocab_size", copyModel(t, func(c map[string]any) {
			delete(c["bert_config"].(map[string]any), "vocab_size")
		}), []string{ContractFile, "bert_config needs a positive vocab_size and type_vocab_size (got 0 and 2"}},
		{"missing signatures", trainingContractOnServingModel,
			[]string{`signature "train_step" is missing`, `signature "apply_gradients" is missing`, `signature "read_variables" is missing`,
				`signature "save_checkpoint" is missing`, `signature "restore_checkpoint" is missing`}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			m, err := Load(tc.dir, testOptions())
			if err == nil {
				m.Close()
				t.Fatal("Load succeeded")
			}
			for _, w := range tc.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error does not mention %q:\n%v", w, err)
				}
			}
		})
	}
	// Serving models of contract versions 1 to 3 still load: versions 2 to 4 changed training
	// signatures only.
	oldServing := filepath.Join(t.TempDir(), "serving")
	if err := copyTree(serving, oldServing); err != nil {
		t.Fatal(err)
	}
	for _, version := range []int{1, 2, 3} {
		editContract(t, oldServing, func(c map[string]any) { c["contract_version"] = version })
		if c, err := LoadClassifier(oldServing, ClassifierOptions{}); err != nil {
			t.Errorf("serving model of contract version %d: %v", version, err)
		} else {
			c.Close()
		}
	}
	editContract(t, oldServing, func(c map[string]any) { c["contract_version"] = 0 })
	if _, err := LoadClassifier(oldServing, ClassifierOptions{}); err == nil || !strings.Contains(err.Error(), "contract version 0") {
		t.Errorf("serving model of contract version 0: %v", err)
	}
	// A training model handed to the Classifier.
	if _, err := LoadClassifier(fixture.Model, ClassifierOptions{}); err == nil || !strings.Contains(err.Error(), "ExportServing") {
		t.Errorf("LoadClassifier(training model): %v", err)
	}
}

func TestBatchErrorsNameTheProblem(t *testing.T) {
	m := loadFixture(t)
	grads := m.NewFlatTensors()
	b := separableBatch(newRand(), 4)
	b.LabelIDs[2] = 5
	if _, err := m.TrainStep(b, DropoutSeed{}, grads); err == nil || !strings.Contains(err.Error(), "example 2 has label_ids 5, want 0..1") {
		t.Errorf("out-of-range label: %v", err)
	}
	// Values the graph would not reject but silently turn into zeros (gather, one_hot) or into
	// a wrong weight: each is refused, naming the tensor, the example, the position and the value.
	vocab := m.contract.VocabSize
	for _, tc := range []struct {
		name string
		edit func(b *features.Batch)
		want string
	}{
		{"input id = vocab size", func(b *features.Batch) { b.InputIDs[1*seqLength+3] = int32(vocab) },
			fmt.Sprintf("example 1 position 3 has input_ids %d, want 0..%d", vocab, vocab-1)},
		{"negative input id", func(b *features.Batch) { b.InputIDs[0] = -1 }, "example 0 position 0 has input_ids -1"},
		{"segment id 2", func(b *features.Batch) { b.SegmentIDs[3*seqLength+1] = 2 },
			"example 3 position 1 has segment_ids 2, want 0..1: the model has 2 token types"},
		{"input mask 2", func(b *features.Batch) { b.InputMask[2*seqLength+5] = 2 }, "example 2 position 5 has input_mask 2, want 0..1"},
		{"is_real_example 3", func(b *features.Batch) { b.IsRealExample[1] = 3 }, "example 1 has is_real_example 3, want 0..1"},
	} {
		b := separableBatch(newRand(), 4)
		tc.edit(b)
		if _, err := m.TrainStep(b, DropoutSeed{}, grads); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: TrainStep: %v, want an error containing %q", tc.name, err, tc.want)
		}
		if _, err := m.Eval(b); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: Eval: %v, want an error containing %q", tc.name, err, tc.want)
		}
		if tc.name == "is_real_example 3" {
			continue // Predict takes no labels
		}
		if _, err := m.Predict(b); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: Predict: %v, want an error containing %q", tc.name, err, tc.want)
		}
	}
	short := separableBatch(newRand(), 4)
	short.SeqLength = 8
	if _, err := m.Eval(short); err == nil || !strings.Contains(err.Error(), "sequence length 8, the model takes 16") {
		t.Errorf("wrong sequence length: %v", err)
	}
	if _, err := m.TrainStep(separableBatch(newRand(), 4), DropoutSeed{}, &FlatTensors{}); err == nil || !strings.Contains(err.Error(), fmt.Sprintf("0 tensors for %d variables", len(m.Variables()))) {
		t.Errorf("unallocated gradients: %v", err)
	}
	if _, err := m.Apply(grads, 1, 1e-3, 0); err == nil || !strings.Contains(err.Error(), "clip norm 0") {
		t.Errorf("zero clip norm: %v", err)
	}
	for _, s := range []float32{0, -0.5, float32(math.Inf(1)), float32(math.NaN())} {
		if _, err := m.Apply(grads, s, 1e-3, 1); err == nil || !strings.Contains(err.Error(), fmt.Sprintf("gradient scale %v is not", s)) {
			t.Errorf("gradient scale %v: %v", s, err)
		}
	}
}

func TestTrainStepDoesNotAllocatePerStepBuffers(t *testing.T) {
	m := loadFixture(t)
	grads := m.NewFlatTensors()
	b := separableBatch(newRand(), 8)
	step := func() {
		if _, err := m.TrainStep(b, DropoutSeed{1, 2}, grads); err != nil {
			t.Fatal(err)
		}
		if _, err := m.Apply(grads, 1, 1e-3, 1); err != nil {
			t.Fatal(err)
		}
	}
	step() // allocates the reusable input and gradient tensors
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	const steps = 10
	for range steps {
		step()
	}
	runtime.ReadMemStats(&after)
	perStep := (after.TotalAlloc - before.TotalAlloc) / steps
	gradientBytes := uint64(4 * len(grads.Data))
	// What remains per step is bookkeeping (tensor handles, fetch slices), not gradient-sized
	// buffers: the gradients land in grads and the apply feeds are overwritten in place.
	if perStep > gradientBytes/2 {
		t.Errorf("%d bytes allocated per step for %d bytes of gradients", perStep, gradientBytes)
	}
	t.Logf("%d Go bytes allocated per train+apply step (gradients: %d bytes)", perStep, gradientBytes)
}
