package bertgraph

import (
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

// InitReport is the outcome of InitFromCheckpoint, or of CheckInitCheckpoint's plan.
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

// maxUnusedListed caps the unused names String prints: a pretrained checkpoint's optimizer
// slots alone are hundreds.
const maxUnusedListed = 20

// String prints the report as BERT's run_classifier logs it, then the checkpoint names no
// variable was read from (the first maxUnusedListed, and how many more).
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
	if len(r.Unused) > 0 {
		fmt.Fprintf(&b, "**** Unused checkpoint names **** (%d)\n", len(r.Unused))
		for _, name := range r.Unused[:min(len(r.Unused), maxUnusedListed)] {
			fmt.Fprintf(&b, "  name = %s\n", name)
		}
		if more := len(r.Unused) - maxUnusedListed; more > 0 {
			fmt.Fprintf(&b, "  ... and %d more\n", more)
		}
	}
	return b.String()
}

// encoderPrefix starts the Google names of the BERT encoder's variables: a checkpoint to
// initialise from must provide some of them (the classifier head alone may be new).
const encoderPrefix = "bert/"

// maxMismatchesListed caps the variables an init-checkpoint error names one by one: BERT-large
// has hundreds, and a wrong checkpoint mismatches them all.
const maxMismatchesListed = 10

// CheckInitCheckpoint matches the checkpoint at prefix against the contract's variables as
// InitFromCheckpoint does, reading only its index (names, dtypes, shapes; no values), and
// returns the plan: which variable would be read from which name. It fails as
// InitFromCheckpoint would: on a name whose shape or dtype differs from its variable's, and on
// a checkpoint that would initialise no encoder (bert/) variable — the wrong file, or one whose
// names follow another convention, which would otherwise train from scratch unnoticed.
func (c *Contract) CheckInitCheckpoint(prefix string) (*InitReport, error) {
	r, err := tf.OpenCheckpoint(prefix)
	if err != nil {
		return nil, fmt.Errorf("bertgraph: init from checkpoint: %w", err)
	}
	defer r.Close()
	return planInit(prefix, r, c.Variables)
}

// planInit is CheckInitCheckpoint on an open checkpoint.
func planInit(prefix string, r *tf.CheckpointReader, vars []VariableSpec) (*InitReport, error) {
	report := &InitReport{Checkpoint: prefix}
	matched := map[string]bool{}
	var mismatches []string
	encoder, encoderInit := 0, 0
	for _, v := range vars {
		e := InitEntry{Variable: v.Name, Shape: v.Shape}
		for _, name := range []string{v.Name, v.CheckpointKey} {
			info, ok := r.Variable(name)
			if !ok {
				continue
			}
			matched[name] = true
			if info.DType != tf.Float || !slices.Equal(info.Shape, v.Shape) {
				mismatches = append(mismatches, fmt.Sprintf("%s is %s%v in the checkpoint, the model's %s is float32%v",
					name, info.DType, info.Shape, v.Name, v.Shape))
			} else {
				e.From = name
			}
			break
		}
		if strings.HasPrefix(v.Name, encoderPrefix) {
			encoder++
			if e.From != "" {
				encoderInit++
			}
		}
		report.Entries = append(report.Entries, e)
	}
	if len(mismatches) > 0 {
		return nil, fmt.Errorf("bertgraph: init checkpoint %s does not fit the model: %d variable(s) differ in shape or dtype:\n  %s",
			prefix, len(mismatches), listSome(mismatches, maxMismatchesListed, "\n  "))
	}
	var names []string
	for _, info := range r.Variables() {
		names = append(names, info.Name)
		if !matched[info.Name] {
			report.Unused = append(report.Unused, info.Name)
		}
	}
	if encoder > 0 && encoderInit == 0 {
		var expected, keys []string
		for _, v := range vars {
			expected = append(expected, v.Name)
			keys = append(keys, v.CheckpointKey)
		}
		return nil, fmt.Errorf("bertgraph: init checkpoint %s initialises none of the model's %d %s variables: its %d name(s) (%s) match neither the Google BERT names the model expects (%s) nor its checkpoint keys (%s)",
			prefix, encoder, encoderPrefix, len(names), listSome(names, 3, ", "), listSome(expected, 3, ", "), listSome(keys, 1, ", "))
	}
	return report, nil
}

// listSome joins the first n items with sep, and says how many more there are.
func listSome(items []string, n int, sep string) string {
	if len(items) <= n {
		return strings.Join(items, sep)
	}
	return strings.Join(items[:n], sep) + fmt.Sprintf("%s... and %d more", sep, len(items)-n)
}

// InitFromCheckpoint sets every model variable the checkpoint at prefix holds, matched by its
// Google name (a pretrained bert_model.ckpt) or by its checkpoint key (a checkpoint written by
// Save); the others keep their values, as BERT's init_from_checkpoint does. It fails, before
// changing anything, where CheckInitCheckpoint does: a name whose shape or dtype differs from
// its variable's, or no encoder variable initialised. Optimizer slots and the global step are
// not touched.
func (m *Model) InitFromCheckpoint(prefix string) (*InitReport, error) {
	r, err := tf.OpenCheckpoint(prefix)
	if err != nil {
		return nil, fmt.Errorf("bertgraph: init from checkpoint: %w", err)
	}
	defer r.Close()
	report, err := planInit(prefix, r, m.contract.Variables)
	if err != nil {
		return nil, err
	}
	values := m.NewFlatTensors()
	if err := m.ReadVariables(values); err != nil {
		return nil, err
	}
	for i, e := range report.Entries {
		if e.From == "" {
			continue
		}
		t, err := r.Read(e.From)
		if err != nil {
			return nil, fmt.Errorf("bertgraph: init from checkpoint %s: %w", prefix, err)
		}
		err = copyOut(t, values.Parts[i])
		t.Close()
		if err != nil {
			return nil, fmt.Errorf("bertgraph: init from checkpoint %s: %s: %w", prefix, e.From, err)
		}
	}
	if err := m.AssignVariables(values); err != nil {
		return nil, err
	}
	return report, nil
}
