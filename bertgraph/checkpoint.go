package bertgraph

import (
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"github.com/gorovod/gorovod/tf"
)

// Save writes every training variable (model variables, optimizer slots, global step) to the
// checkpoint prefix (files prefix.index and prefix.data-00000-of-00001) through the
// save_checkpoint signature, and returns the prefix written. The keys are the contract's
// checkpoint keys, Google BERT's names as run_classifier's checkpoints have them: a variable N
// under N, its Adam slots under N/adam_m and N/adam_v, and global_step; so Google's tooling
// (run_classifier --init_checkpoint, extract_features, Hugging Face's converter) and
// tf.train.load_checkpoint read it. The prefix's directory is created if needed.
func (m *Model) Save(prefix string) (string, error) {
	if err := os.MkdirAll(filepath.Dir(prefix), 0o755); err != nil {
		return "", fmt.Errorf("bertgraph: save: %w", err)
	}
	out, err := m.runPrefix(SigSaveCheckpoint, prefix, "prefix")
	if err != nil {
		return "", fmt.Errorf("bertgraph: save checkpoint %s: %w", prefix, err)
	}
	defer out.Close()
	written, err := out.Strings()
	if err != nil || len(written) != 1 {
		return "", fmt.Errorf("bertgraph: save checkpoint %s: save_checkpoint returned %v (%v), want one prefix", prefix, written, err)
	}
	return written[0], nil
}

// Restore reads every training variable back from a checkpoint written by Save, or by Google
// BERT's run_classifier for the same model (to resume training). It first checks the
// checkpoint's index against the contract and fails, before changing anything, on a missing key
// or one of another dtype or shape, naming them; a checkpoint of the object-based keys gorovod
// wrote before contract version 3 is recognised and the error says how to go on from it.
func (m *Model) Restore(prefix string) error {
	if err := m.checkRestore(prefix); err != nil {
		return err
	}
	out, err := m.runPrefix(SigRestoreCheckpoint, prefix, "global_step")
	if err != nil {
		return fmt.Errorf("bertgraph: restore checkpoint %s: %w", prefix, err)
	}
	out.Close()
	return nil
}

// runPrefix runs the signature key, which takes a checkpoint prefix, and returns its output.
func (m *Model) runPrefix(key, prefix, output string) (*tf.Tensor, error) {
	t, err := tf.NewStringTensor([]string{prefix})
	if err != nil {
		return nil, err
	}
	defer t.Close()
	m.mu.Lock()
	defer m.mu.Unlock()
	s := m.sigs[key]
	s.feed("prefix", t)
	defer delete(s.feeds, s.inputs["prefix"])
	out, err := s.run(m.sm.Session, s.feeds, s.fetches(output))
	if err != nil {
		return nil, err
	}
	return out[0], nil
}

// checkpointEntry is one tensor of a training checkpoint.
type checkpointEntry struct {
	key   string
	what  string // "variable N", "slot N/adam_m", "global_step"
	dtype tf.DataType
	shape []int64
}

// checkpointEntries lists what save_checkpoint writes and restore_checkpoint reads: the model
// variables, the optimizer slots, the global step.
func (c *Contract) checkpointEntries() []checkpointEntry {
	out := make([]checkpointEntry, 0, len(c.Variables)+len(c.Optimizer.Slots)+1)
	for _, v := range c.Variables {
		out = append(out, checkpointEntry{v.CheckpointKey, "variable " + v.Name, tf.Float, v.Shape})
	}
	for _, s := range c.Optimizer.Slots {
		out = append(out, checkpointEntry{s.CheckpointKey, "slot " + s.Name, tf.Float, s.Shape})
	}
	return append(out, checkpointEntry{c.GlobalStep.CheckpointKey, "global_step", tf.Int64, []int64{}})
}

// legacyObjectGraphKey is in every object-based checkpoint (what tf.train.Checkpoint and a TF2
// SavedModel's SaverDef write), as in the training checkpoints of contract version 2 and older.
const legacyObjectGraphKey = "_CHECKPOINTABLE_OBJECT_GRAPH"

// checkRestore checks the index of the checkpoint at prefix holds every training checkpoint
// key with its dtype and shape; it reads no values.
func (m *Model) checkRestore(prefix string) error {
	c := m.contract
	r, err := tf.OpenCheckpoint(prefix)
	if err != nil {
		return fmt.Errorf("bertgraph: restore checkpoint: %w", err)
	}
	defer r.Close()
	var missing, differ []string
	for _, e := range c.checkpointEntries() {
		info, ok := r.Variable(e.key)
		switch {
		case !ok:
			missing = append(missing, e.key)
		case info.DType != e.dtype || !slices.Equal(info.Shape, e.shape):
			differ = append(differ, fmt.Sprintf("%s is %s%v in the checkpoint, the model's %s is %s%v",
				e.key, info.DType, info.Shape, e.what, e.dtype, e.shape))
		}
	}
	if len(missing) == 0 && len(differ) == 0 {
		return nil
	}
	if _, legacy := r.Variable(legacyObjectGraphKey); legacy && len(c.Variables) > 0 {
		if _, ok := r.Variable(c.Variables[0].ObjectKey); ok {
			return fmt.Errorf("bertgraph: checkpoint %s is keyed the old way (object-based keys such as %s, before contract version 3): training cannot resume from it; start a new --output_dir with --init_checkpoint=%s to take its weights",
				prefix, c.Variables[0].ObjectKey, prefix)
		}
	}
	var problems []string
	if len(missing) > 0 {
		problems = append(problems, fmt.Sprintf("%d of the %d training variables are missing: %s",
			len(missing), len(c.checkpointEntries()), listSome(missing, maxMismatchesListed, ", ")))
	}
	if len(differ) > 0 {
		problems = append(problems, fmt.Sprintf("%d differ in dtype or shape:\n  %s", len(differ), listSome(differ, maxMismatchesListed, "\n  ")))
	}
	return fmt.Errorf("bertgraph: checkpoint %s does not fit the model %s: %s", prefix, m.dir, strings.Join(problems, "; "))
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

// maxUnusedListed caps the unused names String prints: a pretrained checkpoint's MLM and NSP
// heads are many.
const maxUnusedListed = 20

// String prints the report as BERT's run_classifier logs it, then the checkpoint names no
// variable was read from: the optimizer state (the Adam slots <variable>/adam_m and
// <variable>/adam_v, global_step) in one line, since every fine-tuned checkpoint has it and
// chained fine-tuning reads one; the others by name (the first maxUnusedListed, and how many more).
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
	if len(r.Unused) == 0 {
		return b.String()
	}
	fmt.Fprintf(&b, "**** Unused checkpoint names **** (%d)\n", len(r.Unused))
	var slots int
	var globalStep bool
	var others []string
	for _, name := range r.Unused {
		switch {
		case name == "global_step":
			globalStep = true
		case strings.HasSuffix(name, "/adam_m"), strings.HasSuffix(name, "/adam_v"):
			slots++
		default:
			others = append(others, name)
		}
	}
	if slots > 0 || globalStep {
		var parts []string
		if slots > 0 {
			parts = append(parts, fmt.Sprintf("%d optimizer slots (*/adam_m, */adam_v)", slots))
		}
		if globalStep {
			parts = append(parts, "global_step")
		}
		fmt.Fprintf(&b, "  %s: the optimizer state of a training checkpoint, not model variables\n", strings.Join(parts, " and "))
	}
	for _, name := range others[:min(len(others), maxUnusedListed)] {
		fmt.Fprintf(&b, "  name = %s\n", name)
	}
	if more := len(others) - maxUnusedListed; more > 0 {
		fmt.Fprintf(&b, "  ... and %d more\n", more)
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
		for _, name := range []string{v.Name, v.CheckpointKey, v.ObjectKey} {
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
			keys = append(keys, v.ObjectKey)
		}
		return nil, fmt.Errorf("bertgraph: init checkpoint %s initialises none of the model's %d %s variables: its %d name(s) (%s) are neither Google BERT names (%s) nor older gorovod keys (%s)",
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
// Google name (a pretrained bert_model.ckpt, a run_classifier checkpoint, a checkpoint written
// by Save) or by its object-based key (a checkpoint gorovod wrote before contract version 3,
// or a SavedModel's variables/variables); the others keep their values, as BERT's init_from_checkpoint does. It fails, before
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
