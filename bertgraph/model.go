package bertgraph

import (
	"errors"
	"fmt"
	"path/filepath"
	"sync"

	"github.com/gorovod/gorovod/tf"
)

// Options configure Load.
type Options struct {
	// Session configures TensorFlow (threads, GPU); nil leaves TensorFlow's defaults.
	Session *tf.SessionOptions
	// Precision is what TrainStep computes its matrix products in (Float32 by default); with
	// Float16 the loss is scaled dynamically, from the contract's initial scale.
	Precision Precision
}

// Model is a loaded training SavedModel. See the package documentation.
type Model struct {
	dir      string
	contract *Contract
	opts     Options
	sm       *tf.SavedModel

	mu      sync.Mutex
	sigs    map[string]*signature
	inputs  batchTensors // reused feeds of train_step
	scalars struct{ scale, lr, clip *tf.Tensor }
	grads   []*tf.Tensor // reused apply_gradients feeds, one per variable

	// Fetch lists, built once: loss, correct, examples, then the gradients in variable order;
	// global_norm, global_step, applied; the variable values in order.
	trainFetches, applyFetches, readFetches, evalFetches []tf.Output
}

// Load loads the training SavedModel in dir and checks it against its contract and against
// what this package feeds and fetches.
func Load(dir string, opts Options) (*Model, error) {
	c, err := ReadContract(dir)
	if err != nil {
		return nil, err
	}
	if c.Kind != "training" {
		return nil, fmt.Errorf("bertgraph: %s is a %q SavedModel; Load takes a training one (a serving one goes to LoadClassifier)", dir, c.Kind)
	}
	sm, err := tf.LoadSavedModel(dir, []string{"serve"}, opts.Session)
	if err != nil {
		return nil, fmt.Errorf("bertgraph: %w", err)
	}
	m := &Model{dir: dir, contract: c, opts: opts, sm: sm}
	if err := m.init(); err != nil {
		return nil, errors.Join(err, sm.Close())
	}
	return m, nil
}

func (m *Model) init() error {
	if err := m.contract.validate(m.sm); err != nil {
		return err
	}
	var err error
	if m.sigs, err = resolveSignatures(m.sm, m.contract.expectedSignatures()); err != nil {
		return err
	}
	keys := []string{"loss", "correct", "examples"}
	values := make([]string, 0, len(m.contract.Variables))
	for _, v := range m.contract.Variables {
		keys = append(keys, v.GradientKey)
		values = append(values, v.ValueKey)
	}
	m.trainFetches = m.sigs[m.opts.Precision.trainStep()].fetches(keys...)
	m.applyFetches = m.sigs[SigApplyGradients].fetches("global_norm", "global_step", "applied", "loss_scale")
	m.readFetches = m.sigs[SigReadVariables].fetches(values...)
	m.evalFetches = m.sigs[SigEvalStep].fetches("loss_sum", "correct", "examples")
	if m.sm.SaverDef == nil {
		return fmt.Errorf("bertgraph: %s has no SaverDef; ExportServing needs one", m.dir)
	}
	return m.startLossScale()
}

// startLossScale sets the loss scale the precision needs: float16's dynamic one from the
// contract's start, else a static 1 (exact: float32 and bfloat16 steps are then what they are
// without loss scaling). The scale is not in training checkpoints, so a resumed run starts
// again from here.
func (m *Model) startLossScale() error {
	scale, growth := float32(1), int64(0)
	if m.opts.Precision == Float16 {
		ls := m.contract.LossScale
		if !(ls.Initial >= 1) || ls.GrowthInterval < 1 {
			return fmt.Errorf("bertgraph: %s: loss_scale initial %v, growth_interval %d: want a scale >= 1 and an interval >= 1; re-export the model",
				m.dir, ls.Initial, ls.GrowthInterval)
		}
		scale, growth = ls.Initial, ls.GrowthInterval
	}
	s := m.sigs[SigSetLossScale]
	scaleT, err := tf.NewTensor([]float32{scale})
	if err != nil {
		return err
	}
	defer scaleT.Close()
	growthT, err := tf.NewTensor([]int64{growth})
	if err != nil {
		return err
	}
	defer growthT.Close()
	s.feed("loss_scale", scaleT)
	s.feed("growth_interval", growthT)
	out, err := s.run(m.sm.Session, s.feeds, s.fetches("loss_scale"))
	if err != nil {
		return err
	}
	closeAll(out)
	return nil
}

// Close releases the session and every tensor the model holds.
func (m *Model) Close() error {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.inputs.close()
	for _, t := range m.grads {
		t.Close()
	}
	m.grads = nil
	m.scalars.scale.Close()
	m.scalars.lr.Close()
	m.scalars.clip.Close()
	return m.sm.Close()
}

// Precision is what TrainStep computes its matrix products in.
func (m *Model) Precision() Precision { return m.opts.Precision }

// Dir is the SavedModel directory.
func (m *Model) Dir() string { return m.dir }

// Contract is the model's contract (read-only).
func (m *Model) Contract() *Contract { return m.contract }

// Variables lists the model variables in gradient order (read-only).
func (m *Model) Variables() []VariableSpec { return m.contract.Variables }

// NumLabels is the number of classes.
func (m *Model) NumLabels() int { return m.contract.NumLabels }

// MaxSeqLength is the sequence length every batch must have.
func (m *Model) MaxSeqLength() int { return m.contract.MaxSeqLength }

// VocabPath is the vocabulary packaged with the model.
func (m *Model) VocabPath() string { return filepath.Join(m.dir, m.contract.VocabFile) }

// signature is a signature resolved to graph tensors, with a reusable feed map.
type signature struct {
	key     string
	inputs  map[string]tf.Output
	outputs map[string]tf.Output
	feeds   map[tf.Output]*tf.Tensor
}

func resolveSignatures(sm *tf.SavedModel, want map[string]ContractSignature) (map[string]*signature, error) {
	out := make(map[string]*signature, len(want))
	for key, spec := range want {
		sig, err := sm.Signature(key)
		if err != nil {
			return nil, err
		}
		s := &signature{key: key, inputs: map[string]tf.Output{}, outputs: map[string]tf.Output{},
			feeds: make(map[tf.Output]*tf.Tensor, len(sig.Inputs))}
		for _, part := range []struct {
			infos []tf.TensorInfo
			want  map[string]TensorSpec
			into  map[string]tf.Output
		}{{sig.Inputs, spec.Inputs, s.inputs}, {sig.Outputs, spec.Outputs, s.outputs}} {
			for _, info := range part.infos {
				if _, needed := part.want[info.Key]; !needed {
					continue
				}
				o, err := sm.Graph.Output(info.Name)
				if err != nil {
					return nil, fmt.Errorf("bertgraph: %s: signature %q key %q: %w", sm.Dir, key, info.Key, err)
				}
				part.into[info.Key] = o
			}
		}
		out[key] = s
	}
	return out, nil
}

// fetches returns the outputs named by keys, in that order.
func (s *signature) fetches(keys ...string) []tf.Output {
	out := make([]tf.Output, len(keys))
	for i, k := range keys {
		out[i] = s.outputs[k]
	}
	return out
}

// run feeds feeds (s.feeds, set through feed, or a map of the caller's own) and fetches the
// given outputs.
func (s *signature) run(sess *tf.Session, feeds map[tf.Output]*tf.Tensor, fetches []tf.Output) ([]*tf.Tensor, error) {
	out, err := sess.Run(feeds, fetches, nil)
	if err != nil {
		return nil, fmt.Errorf("bertgraph: signature %q: %w", s.key, err)
	}
	return out, nil
}

func (s *signature) feed(key string, t *tf.Tensor) { s.feeds[s.inputs[key]] = t }

func closeAll(ts []*tf.Tensor) {
	for _, t := range ts {
		t.Close()
	}
}
