package bertgraph

import (
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"github.com/gorovod/gorovod/tf"
)

// ContractVersion is the version of the exporter's contract this package drives. Version 2
// added apply_gradients' gradient_scale input; version 3 the save_checkpoint and
// restore_checkpoint signatures, which key training checkpoints by Google BERT names; version 4
// mixed precision: the train_step_bfloat16 and train_step_float16 signatures and the loss scale.
const ContractVersion = 4

// contractChanges says, for each version after 1, what a training model exported before it
// lacks: the reason a re-export is needed.
var contractChanges = map[int]string{
	2: "apply_gradients takes the input gradient_scale",
	3: "training checkpoints are written and read by save_checkpoint and restore_checkpoint, keyed by Google BERT names",
	4: "train_step has bfloat16 and float16 variants and apply_gradients keeps a loss scale (--amp)",
}

// Paths inside an exported SavedModel directory.
const (
	ContractFile = "assets.extra/gorovod_contract.json"
	VocabFile    = "assets.extra/vocab.txt"
)

// Signature keys of the training SavedModel.
const (
	SigTrainStep         = "train_step"
	SigApplyGradients    = "apply_gradients"
	SigEvalStep          = "eval_step"
	SigPredict           = "predict"
	SigServingDefault    = "serving_default"
	SigReadVariables     = "read_variables"
	SigAssignVariables   = "assign_variables"
	SigSaveCheckpoint    = "save_checkpoint"
	SigRestoreCheckpoint = "restore_checkpoint"
	// train_step with its matrix products in bfloat16 or float16 (Precision.trainStep).
	SigTrainStepBFloat16 = "train_step_bfloat16"
	SigTrainStepFloat16  = "train_step_float16"
	SigSetLossScale      = "set_loss_scale"
)

// Contract is assets.extra/gorovod_contract.json, written by bertgraph/exporter/export.py.
type Contract struct {
	Version      int             `json:"contract_version"`
	Kind         string          `json:"kind"` // "training" or "serving"
	BertConfig   json.RawMessage `json:"bert_config"`
	NumLabels    int             `json:"num_labels"`
	LabelNames   []string        `json:"label_names"`
	MaxSeqLength int             `json:"max_seq_length"`
	DoLowerCase  bool            `json:"do_lower_case"`
	VocabFile    string          `json:"vocab_file"`
	// KeepTailTokens is the head+tail truncation training used (features.Converter's
	// WithTailTokens; 0, or absent, is BERT's head alone): a serving export records it.
	KeepTailTokens int `json:"keep_tail_tokens,omitempty"`
	// Dropout says whether train_step applies dropout (the exporter can turn it off).
	Dropout    bool                         `json:"dropout"`
	Signatures map[string]ContractSignature `json:"signatures"`
	// Variables are the model's variables in gradient order.
	Variables  []VariableSpec `json:"variables"`
	GlobalStep struct {
		Name          string `json:"name"`
		CheckpointKey string `json:"checkpoint_key"`
	} `json:"global_step"`
	Optimizer struct {
		Name            string  `json:"name"`
		DefaultClipNorm float32 `json:"default_clip_norm"`
		// Slots are AdamWeightDecay's adam_m and adam_v of every variable.
		Slots []SlotSpec `json:"slots"`
	} `json:"optimizer"`
	// LossScale is the dynamic loss scale's start for float16 compute: Initial, doubled after
	// GrowthInterval finite steps in a row, halved on each non-finite one.
	LossScale struct {
		Initial        float32 `json:"initial"`
		GrowthInterval int64   `json:"growth_interval"`
	} `json:"loss_scale"`
	// ServingDir is the serving-only SavedModel packaged inside a training one.
	ServingDir string `json:"serving_dir"`

	// VocabSize and TypeVocabSize are bert_config's vocab_size and type_vocab_size: batches
	// are checked against them, since the graph's gather and one_hot turn an out-of-range
	// input_ids or segment_ids value into zeros instead of failing.
	VocabSize     int `json:"-"`
	TypeVocabSize int `json:"-"`
}

// ContractSignature lists a signature's inputs and outputs by key.
type ContractSignature struct {
	Inputs  map[string]TensorSpec `json:"inputs"`
	Outputs map[string]TensorSpec `json:"outputs"`
}

// TensorSpec is a dtype name ("float32", "int32", ...) and a shape (-1: any size).
type TensorSpec struct {
	DType string  `json:"dtype"`
	Shape []int64 `json:"shape"`
}

// VariableSpec is one model variable.
type VariableSpec struct {
	Name        string  `json:"name"` // the Google checkpoint name, e.g. bert/pooler/dense/kernel
	Shape       []int64 `json:"shape"`
	DType       string  `json:"dtype"`
	GradientKey string  `json:"gradient_key"` // train_step output, apply_gradients input
	ValueKey    string  `json:"value_key"`    // read_variables output, assign_variables input
	// CheckpointKey is the key in training checkpoints (save_checkpoint): the Google name, as
	// run_classifier's checkpoints have it.
	CheckpointKey string `json:"checkpoint_key"`
	// ObjectKey is the object-based key <name>/.ATTRIBUTES/VARIABLE_VALUE: the key in the
	// SavedModel's own variables/ (and the serving model's), and in the training checkpoints
	// gorovod wrote before contract version 3.
	ObjectKey   string `json:"object_key"`
	WeightDecay bool   `json:"weight_decay"`
}

// SlotSpec is one optimizer slot: <variable name>/adam_m or /adam_v.
type SlotSpec struct {
	Name          string  `json:"name"`
	CheckpointKey string  `json:"checkpoint_key"`
	Shape         []int64 `json:"shape"`
	DType         string  `json:"dtype"`
}

// NumElements is the product of the shape.
func (v VariableSpec) NumElements() int {
	n := 1
	for _, d := range v.Shape {
		n *= int(d)
	}
	return n
}

// ReadContract reads and decodes dir's contract file.
func ReadContract(dir string) (*Contract, error) {
	path := filepath.Join(dir, ContractFile)
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("bertgraph: %s is not a gorovod BERT SavedModel: %w", dir, err)
	}
	var c Contract
	if err := json.Unmarshal(b, &c); err != nil {
		return nil, fmt.Errorf("bertgraph: %s: %w", path, err)
	}
	// Versions 2 to 4 changed training signatures only: serving models exported before them
	// still load.
	if c.Version != ContractVersion && !(c.Kind == "serving" && c.Version >= 1 && c.Version < ContractVersion) {
		var why []string
		for v := max(c.Version+1, 2); v <= ContractVersion; v++ {
			why = append(why, fmt.Sprintf("since version %d, %s", v, contractChanges[v]))
		}
		reason := ""
		if len(why) > 0 {
			reason = " (" + strings.Join(why, "; ") + ")"
		}
		return nil, fmt.Errorf("bertgraph: %s: contract version %d, this build drives version %d%s: re-export the model",
			path, c.Version, ContractVersion, reason)
	}
	if c.NumLabels < 2 || len(c.LabelNames) != c.NumLabels || c.MaxSeqLength < 1 {
		return nil, fmt.Errorf("bertgraph: %s: num_labels %d with %d label names, max_seq_length %d",
			path, c.NumLabels, len(c.LabelNames), c.MaxSeqLength)
	}
	var bert struct {
		VocabSize     int `json:"vocab_size"`
		TypeVocabSize int `json:"type_vocab_size"`
	}
	if err := json.Unmarshal(c.BertConfig, &bert); err != nil || bert.VocabSize < 1 || bert.TypeVocabSize < 1 {
		return nil, fmt.Errorf("bertgraph: %s: bert_config needs a positive vocab_size and type_vocab_size (got %d and %d; %v)",
			path, bert.VocabSize, bert.TypeVocabSize, err)
	}
	c.VocabSize, c.TypeVocabSize = bert.VocabSize, bert.TypeVocabSize
	return &c, nil
}

// batchSpec is what every batch-fed signature takes for its features.
func batchInputs(seq int64) map[string]TensorSpec {
	return map[string]TensorSpec{
		"input_ids":   {"int32", []int64{-1, seq}},
		"input_mask":  {"int32", []int64{-1, seq}},
		"segment_ids": {"int32", []int64{-1, seq}},
	}
}

func withLabels(m map[string]TensorSpec) map[string]TensorSpec {
	m["label_ids"] = TensorSpec{"int32", []int64{-1}}
	m["is_real_example"] = TensorSpec{"int32", []int64{-1}}
	return m
}

func scalar(dtype string) TensorSpec { return TensorSpec{dtype, []int64{}} }

// expectedSignatures is what this package feeds and fetches, derived from the contract's
// variables and max_seq_length; validate checks the SavedModel carries at least this.
func (c *Contract) expectedSignatures() map[string]ContractSignature {
	seq := int64(c.MaxSeqLength)
	labels := int64(c.NumLabels)
	predictions := map[string]TensorSpec{
		"probabilities": {"float32", []int64{-1, labels}},
		"logits":        {"float32", []int64{-1, labels}},
	}
	if c.Kind == "serving" {
		return map[string]ContractSignature{SigServingDefault: {batchInputs(seq), predictions}}
	}
	train := ContractSignature{
		Inputs: withLabels(batchInputs(seq)),
		Outputs: map[string]TensorSpec{
			"loss": scalar("float32"), "correct": scalar("int32"), "examples": scalar("int32"),
		},
	}
	train.Inputs["dropout_seed"] = TensorSpec{"int64", []int64{2}}
	apply := ContractSignature{
		Inputs: map[string]TensorSpec{
			"gradient_scale": scalar("float32"), "learning_rate": scalar("float32"), "clip_norm": scalar("float32"),
		},
		Outputs: map[string]TensorSpec{
			"global_norm": scalar("float32"), "global_step": scalar("int64"), "applied": scalar("bool"),
			"loss_scale": scalar("float32"),
		},
	}
	read := ContractSignature{Inputs: map[string]TensorSpec{},
		Outputs: map[string]TensorSpec{"global_step": scalar("int64")}}
	assign := ContractSignature{Inputs: map[string]TensorSpec{},
		Outputs: map[string]TensorSpec{"num_assigned": scalar("int32")}}
	prefix := map[string]TensorSpec{"prefix": scalar("string")}
	for _, v := range c.Variables {
		spec := TensorSpec{"float32", v.Shape}
		train.Outputs[v.GradientKey] = spec
		apply.Inputs[v.GradientKey] = spec
		read.Outputs[v.ValueKey] = spec
		assign.Inputs[v.ValueKey] = spec
	}
	return map[string]ContractSignature{
		SigTrainStep:         train,
		SigTrainStepBFloat16: train,
		SigTrainStepFloat16:  train,
		SigSetLossScale: {map[string]TensorSpec{"loss_scale": scalar("float32"), "growth_interval": scalar("int64")},
			map[string]TensorSpec{"loss_scale": scalar("float32")}},
		SigApplyGradients:  apply,
		SigEvalStep:        {withLabels(batchInputs(seq)), map[string]TensorSpec{"loss_sum": scalar("float32"), "correct": scalar("int32"), "examples": scalar("int32")}},
		SigPredict:         {batchInputs(seq), predictions},
		SigServingDefault:  {batchInputs(seq), predictions},
		SigReadVariables:   read,
		SigAssignVariables: assign,
		SigSaveCheckpoint:  {prefix, map[string]TensorSpec{"prefix": scalar("string")}},
		SigRestoreCheckpoint: {map[string]TensorSpec{"prefix": scalar("string")},
			map[string]TensorSpec{"global_step": scalar("int64")}},
	}
}

// validate checks the contract's own consistency and the SavedModel's signatures against what
// this package will feed and fetch. Every problem is reported, each naming the signature, the
// key and what differs.
func (c *Contract) validate(sm *tf.SavedModel) error {
	var errs []error
	bad := func(format string, args ...any) { errs = append(errs, fmt.Errorf(format, args...)) }
	if c.Kind != "training" && c.Kind != "serving" {
		bad("kind %q is neither training nor serving", c.Kind)
	}
	if c.Kind == "training" {
		if len(c.Variables) == 0 {
			bad("the contract lists no variables")
		}
		seen := map[string]bool{}
		for i, v := range c.Variables {
			if v.Name == "" || v.GradientKey == "" || v.ValueKey == "" || v.DType != "float32" {
				bad("variable %d (%q) lacks a name, a gradient key or a value key, or is not float32", i, v.Name)
			}
			if seen[v.Name] {
				bad("variable %q is listed twice", v.Name)
			}
			seen[v.Name] = true
		}
		if len(c.Optimizer.Slots) != 2*len(c.Variables) {
			bad("the optimizer has %d slots for %d variables, want 2 each (adam_m, adam_v)", len(c.Optimizer.Slots), len(c.Variables))
		}
		keys := map[string]bool{}
		for _, e := range c.checkpointEntries() {
			if e.key == "" || keys[e.key] {
				bad("training checkpoint key %q of %s is empty or repeated", e.key, e.what)
			}
			keys[e.key] = true
		}
		grads := 0
		for k := range c.Signatures[SigTrainStep].Outputs {
			if strings.HasPrefix(k, "grad_") {
				grads++
			}
		}
		if grads != len(c.Variables) {
			bad("train_step has %d gradient outputs for %d variables", grads, len(c.Variables))
		}
	}
	expected := c.expectedSignatures()
	for _, key := range slices.Sorted(maps.Keys(expected)) {
		want := expected[key]
		sig, err := sm.Signature(key)
		if err != nil {
			bad("signature %q is missing", key)
			continue
		}
		check := func(kind string, infos []tf.TensorInfo, specs map[string]TensorSpec) {
			for _, k := range slices.Sorted(maps.Keys(specs)) {
				spec := specs[k]
				i, ok := slices.BinarySearchFunc(infos, k, func(t tf.TensorInfo, k string) int { return strings.Compare(t.Key, k) })
				if !ok {
					bad("signature %q has no %s %q", key, kind, k)
					continue
				}
				info := infos[i]
				if info.DType.String() != spec.DType {
					bad("signature %q %s %q is %s, want %s", key, kind, k, info.DType, spec.DType)
				}
				if info.Shape.UnknownRank || !slices.Equal(info.Shape.Dims, spec.Shape) {
					bad("signature %q %s %q has shape %s, want %s", key, kind, k, info.Shape, tf.Shape{Dims: spec.Shape})
				}
			}
		}
		check("input", sig.Inputs, want.Inputs)
		check("output", sig.Outputs, want.Outputs)
		if len(sig.Inputs) != len(want.Inputs) {
			bad("signature %q has %d inputs, want %d", key, len(sig.Inputs), len(want.Inputs))
		}
	}
	if len(errs) > 0 {
		return fmt.Errorf("bertgraph: %s does not satisfy the contract in %s: %w", sm.Dir, ContractFile, errors.Join(errs...))
	}
	return nil
}
