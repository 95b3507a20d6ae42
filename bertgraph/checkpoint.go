package bertgraph

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"github.com/gorovod/gorovod/tf"
)

// Save writes every variable (model, optimizer slots, global step) to the checkpoint prefix
// through the SaverDef, and returns the prefix written. The keys are listed in the contract
// (checkpoint_key); Python reads the files with tf.train.load_checkpoint. The prefix's
// directory is created if needed.
func (m *Model) Save(prefix string) (string, error) {
	if err := os.MkdirAll(filepath.Dir(prefix), 0o755); err != nil {
		return "", fmt.Errorf("bertgraph: save: %w", err)
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	p, err := m.sm.Save(prefix)
	if err != nil {
		return "", fmt.Errorf("bertgraph: %w", err)
	}
	return p, nil
}

// Restore reads every variable back from a checkpoint written by Save (to resume training).
func (m *Model) Restore(prefix string) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if err := m.sm.Restore(prefix); err != nil {
		return fmt.Errorf("bertgraph: %w", err)
	}
	return nil
}

// InitEntry says where one model variable's initial value came from.
type InitEntry struct {
	Variable string
	Shape    []int64
	// From is the checkpoint name it was read from, "" when the checkpoint has none.
	From string
}

// InitReport is the outcome of InitFromCheckpoint.
type InitReport struct {
	Checkpoint string
	Entries    []InitEntry // every model variable, in the contract's order
	// Unused are checkpoint names no model variable was read from (optimizer slots, the MLM
	// head, global_step, ...).
	Unused []string
}

// Initialized and Missing count the entries with and without a checkpoint value.
func (r *InitReport) Initialized() int {
	n := 0
	for _, e := range r.Entries {
		if e.From != "" {
			n++
		}
	}
	return n
}

// Missing lists the model variables the checkpoint did not have (they keep their values).
func (r *InitReport) Missing() []string {
	var out []string
	for _, e := range r.Entries {
		if e.From == "" {
			out = append(out, e.Variable)
		}
	}
	return out
}

// String prints the report as BERT's run_classifier logs it.
func (r *InitReport) String() string {
	var b strings.Builder
	fmt.Fprintf(&b, "**** Trainable Variables **** (init from %s: %d of %d)\n", r.Checkpoint, r.Initialized(), len(r.Entries))
	for _, e := range r.Entries {
		dims := make([]string, len(e.Shape))
		for i, d := range e.Shape {
			dims[i] = fmt.Sprint(d)
		}
		init := ""
		if e.From != "" {
			init = ", *INIT_FROM_CKPT*"
			if e.From != e.Variable {
				init += " (from " + e.From + ")"
			}
		}
		fmt.Fprintf(&b, "  name = %s, shape = (%s)%s\n", e.Variable, strings.Join(dims, ", "), init)
	}
	return b.String()
}

// InitFromCheckpoint sets every model variable the checkpoint at prefix holds, matched by its
// Google name (a pretrained bert_model.ckpt) or by its checkpoint key (a checkpoint written by
// Save); the others keep their values, as BERT's init_from_checkpoint does. A name whose
// shape or dtype differs from the variable's is an error naming both. Optimizer slots and the
// global step are not touched.
func (m *Model) InitFromCheckpoint(prefix string) (*InitReport, error) {
	r, err := tf.OpenCheckpoint(prefix)
	if err != nil {
		return nil, fmt.Errorf("bertgraph: init from checkpoint: %w", err)
	}
	defer r.Close()
	values := m.NewFlatTensors()
	if err := m.ReadVariables(values); err != nil {
		return nil, err
	}
	report := &InitReport{Checkpoint: prefix}
	used := map[string]bool{}
	var errs []error
	for i, v := range m.contract.Variables {
		e := InitEntry{Variable: v.Name, Shape: v.Shape}
		for _, name := range []string{v.Name, v.CheckpointKey} {
			info, ok := r.Variable(name)
			if !ok {
				continue
			}
			if info.DType != tf.Float || !slices.Equal(info.Shape, v.Shape) {
				errs = append(errs, fmt.Errorf("%s is %s%v in the checkpoint, the model's %s is float32%v",
					name, info.DType, info.Shape, v.Name, v.Shape))
				break
			}
			t, err := r.Read(name)
			if err != nil {
				errs = append(errs, err)
				break
			}
			err = copyOut(t, values.Parts[i], name)
			t.Close()
			if err != nil {
				errs = append(errs, err)
				break
			}
			e.From = name
			used[name] = true
			break
		}
		report.Entries = append(report.Entries, e)
	}
	if len(errs) > 0 {
		return nil, fmt.Errorf("bertgraph: init from checkpoint %s: %w", prefix, errors.Join(errs...))
	}
	for _, info := range r.Variables() {
		if !used[info.Name] {
			report.Unused = append(report.Unused, info.Name)
		}
	}
	if err := m.AssignVariables(values); err != nil {
		return nil, err
	}
	return report, nil
}
