package bertgraph

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"github.com/gorovod/gorovod/bertgraph/tokenizer"
	"github.com/gorovod/gorovod/tf"
	"golang.org/x/sys/unix"
)

// ExportServing writes the model's current weights as a serving SavedModel in dir (replaced if
// it exists), loadable by Python's tf.saved_model.load, saved_model_cli and TensorFlow Serving,
// with a serving_default signature (input_ids, input_mask, segment_ids -> probabilities, logits)
// and no optimizer state.
//
// How: the exporter packaged a serving-only SavedModel inside the training one (the contract's
// serving_dir) whose model variables have the same object-based keys (object_key) as the
// training SavedModel's. ExportServing saves the training variables to a temporary checkpoint
// through the training SavedModel's SaverDef (object-based keys, unlike Save's Google names),
// loads the serving model, restores that checkpoint into it through its own SaverDef (which
// reads only the keys it has), and saves it through the same SaverDef into dir/variables.
// saved_model.pb and assets.extra (contract, vocabulary, bert_config.json) are copied, so the graph is exactly the one the exporter wrote
// and only the weights are new; opts then replace the vocabulary, casing and label names the
// export records, so that a Classifier on it tokenises and names labels as training did.
//
// dir must lie outside the model being exported from: an export there replaces it, moved aside
// as the new export is renamed into place and then removed (put back if the rename fails), so
// dir equal to, above or inside the training model (or its serving source) is refused rather
// than deleting the model. The staging directories that exports into
// dir killed before the end left beside it are removed too: two exports into one dir at once
// are not supported.
func (m *Model) ExportServing(dir string, opts ExportOptions) (err error) {
	src := filepath.Join(m.dir, m.contract.ServingDir)
	sc, err := ReadContract(src)
	if err != nil {
		return err
	}
	if err := opts.check(sc); err != nil {
		return fmt.Errorf("bertgraph: export serving: %w", err)
	}
	if err := sameVariables(sc.Variables, m.contract.Variables); err != nil {
		return fmt.Errorf("bertgraph: serving model %s: %w", src, err)
	}
	dir = filepath.Clean(dir)
	if err := outside(dir, m.dir, src); err != nil {
		return fmt.Errorf("bertgraph: export serving: %w", err)
	}
	if err := os.MkdirAll(filepath.Dir(dir), 0o755); err != nil {
		return fmt.Errorf("bertgraph: export serving: %w", err)
	}
	// An export killed before it removed its staging directory (kill -9) left it, as large as
	// the model: dir's exports are this one's to replace, so their leftovers are too.
	staged := filepath.Join(filepath.Dir(dir), "."+filepath.Base(dir)+".export-")
	if err := removeStaleExports(staged); err != nil {
		return fmt.Errorf("bertgraph: export serving: %w", err)
	}
	tmp, err := os.MkdirTemp(filepath.Dir(dir), filepath.Base(staged))
	if err != nil {
		return fmt.Errorf("bertgraph: export serving: %w", err)
	}
	defer func() { err = errors.Join(err, os.RemoveAll(tmp)) }()

	trained := filepath.Join(tmp, "trained", "ckpt")
	if err := m.saveObjectBased(trained); err != nil {
		return fmt.Errorf("bertgraph: export serving: %w", err)
	}
	serving, err := tf.LoadSavedModel(src, []string{"serve"}, m.opts.Session)
	if err != nil {
		return fmt.Errorf("bertgraph: export serving: %w", err)
	}
	defer func() { err = errors.Join(err, serving.Close()) }()
	if err := serving.Restore(trained); err != nil {
		return fmt.Errorf("bertgraph: export serving: %w", err)
	}
	staging := filepath.Join(tmp, "model")
	for _, name := range []string{"saved_model.pb", "assets", "assets.extra"} {
		if err := copyTree(filepath.Join(src, name), filepath.Join(staging, name)); err != nil {
			return fmt.Errorf("bertgraph: export serving: %w", err)
		}
	}
	if err := opts.apply(staging, sc); err != nil {
		return fmt.Errorf("bertgraph: export serving: %w", err)
	}
	if err := os.MkdirAll(filepath.Join(staging, "variables"), 0o755); err != nil {
		return fmt.Errorf("bertgraph: export serving: %w", err)
	}
	if _, err := serving.Save(filepath.Join(staging, "variables", "variables")); err != nil {
		return fmt.Errorf("bertgraph: export serving: %w", err)
	}
	// The new export takes the previous one's place in one step where the filesystem can swap
	// two directories (renameat2's RENAME_EXCHANGE): a reader of dir (a model server polling it)
	// sees one export or the other, never none, and a kill leaves one in place. The previous
	// export, now at staging, goes with tmp.
	switch err := unix.Renameat2(unix.AT_FDCWD, staging, unix.AT_FDCWD, dir, unix.RENAME_EXCHANGE); {
	case err == nil:
		return nil
	case !errors.Is(err, unix.ENOENT) && !errors.Is(err, unix.EINVAL) && !errors.Is(err, unix.ENOSYS):
		return fmt.Errorf("bertgraph: export serving: swapping %s for the previous export: %w", dir, err)
	}
	// No previous export (ENOENT), or a filesystem without the swap: the previous export moves
	// aside into tmp (removed with it) rather than being deleted first, and should the new one
	// fail to move into place, the previous one goes back.
	previous := filepath.Join(tmp, "previous")
	if err := os.Rename(dir, previous); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("bertgraph: export serving: %w", err)
	}
	if err := os.Rename(staging, dir); err != nil {
		if restore := os.Rename(previous, dir); restore != nil && !errors.Is(restore, fs.ErrNotExist) {
			err = errors.Join(err, fmt.Errorf("putting the previous export back: %w", restore))
		}
		return fmt.Errorf("bertgraph: export serving: %w", err)
	}
	return nil
}

// removeStaleExports removes the staging directories of prefix: prefix and the digits
// os.MkdirTemp appends, nothing else (the staging of an export into a sibling named like
// "<base>.export-x" starts with prefix too, and is that export's).
func removeStaleExports(prefix string) error {
	entries, err := os.ReadDir(filepath.Dir(prefix))
	if err != nil {
		return err
	}
	var errs []error
	for _, e := range entries {
		suffix, ok := strings.CutPrefix(e.Name(), filepath.Base(prefix))
		if e.IsDir() && ok && suffix != "" && strings.Trim(suffix, "0123456789") == "" {
			errs = append(errs, os.RemoveAll(filepath.Join(filepath.Dir(prefix), e.Name())))
		}
	}
	return errors.Join(errs...)
}

// saveObjectBased writes every variable to the checkpoint prefix through the SavedModel's
// SaverDef, under the object-based keys the serving model's SaverDef restores.
func (m *Model) saveObjectBased(prefix string) error {
	if err := os.MkdirAll(filepath.Dir(prefix), 0o755); err != nil {
		return err
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	_, err := m.sm.Save(prefix)
	return err
}

// ExportOptions say how the exported model's inputs were made in training, when not as the
// exporter packaged them: a run with its own vocabulary, casing or label names passes them, and
// the export's assets.extra/vocab.txt and contract (do_lower_case, label_names) record them.
// Zero fields keep the packaged values.
type ExportOptions struct {
	// VocabFile is the vocabulary training tokenised with; it is copied to the export.
	VocabFile string
	// DoLowerCase is the casing training tokenised with; nil keeps the packaged one.
	DoLowerCase *bool
	// LabelNames name the classes by label id; nil keeps the packaged names.
	LabelNames []string
	// KeepTailTokens is training's head+tail truncation (features.Converter.WithTailTokens);
	// 0 keeps the packaged truncation, the head alone.
	KeepTailTokens int
}

// check refuses options the serving model c cannot honour: a vocabulary that does not load,
// lacks a special token or has ids beyond the embedding table, or a label list of another
// length, with empty or repeated names.
func (o ExportOptions) check(c *Contract) error {
	if o.VocabFile != "" {
		v, err := tokenizer.LoadVocab(o.VocabFile)
		if err != nil {
			return err
		}
		if v.Size() > c.VocabSize {
			return fmt.Errorf("vocabulary %s has %d tokens but the model embeds only vocab_size %d", o.VocabFile, v.Size(), c.VocabSize)
		}
		for _, special := range []string{"[CLS]", "[SEP]", "[UNK]"} {
			if _, ok := v.ID(special); !ok {
				return fmt.Errorf("vocabulary %s has no %s token", o.VocabFile, special)
			}
		}
	}
	if o.KeepTailTokens < 0 || o.KeepTailTokens > c.MaxSeqLength-2 {
		return fmt.Errorf("%d tail tokens for sequences of %d: want 0 to %d", o.KeepTailTokens, c.MaxSeqLength, c.MaxSeqLength-2)
	}
	if o.LabelNames != nil {
		if len(o.LabelNames) != c.NumLabels {
			return fmt.Errorf("%d label names (%s) for a model of %d labels", len(o.LabelNames), strings.Join(o.LabelNames, ","), c.NumLabels)
		}
		seen := map[string]bool{}
		for _, n := range o.LabelNames {
			if n == "" || seen[n] {
				return fmt.Errorf("label names %q: each must be non-empty and distinct", o.LabelNames)
			}
			seen[n] = true
		}
	}
	return nil
}

// apply writes the options into the export staged in dir, whose contract is c: the vocabulary
// over the packaged one, the casing, label names and truncation into the contract, its other
// fields as they were.
func (o ExportOptions) apply(dir string, c *Contract) error {
	if o.VocabFile != "" {
		if err := copyFile(o.VocabFile, filepath.Join(dir, c.VocabFile)); err != nil {
			return err
		}
	}
	if o.DoLowerCase == nil && o.LabelNames == nil && o.KeepTailTokens == 0 {
		return nil
	}
	path := filepath.Join(dir, ContractFile)
	b, err := os.ReadFile(path)
	if err != nil {
		return err
	}
	var fields map[string]json.RawMessage
	if err := json.Unmarshal(b, &fields); err != nil {
		return fmt.Errorf("%s: %w", path, err)
	}
	if o.DoLowerCase != nil {
		fields["do_lower_case"], _ = json.Marshal(*o.DoLowerCase)
	}
	if o.LabelNames != nil {
		fields["label_names"], _ = json.Marshal(o.LabelNames)
	}
	if o.KeepTailTokens != 0 {
		fields["keep_tail_tokens"], _ = json.Marshal(o.KeepTailTokens)
	}
	// As the exporter writes it (json.dumps(indent=1, sort_keys=True)).
	if b, err = json.MarshalIndent(fields, "", " "); err != nil {
		return err
	}
	return os.WriteFile(path, append(b, '\n'), 0o644)
}

// outside checks that dir and each of the protected paths are disjoint trees: neither is the
// other nor contains it, once made absolute and with symbolic links followed.
func outside(dir string, protected ...string) error {
	d, err := resolve(dir)
	if err != nil {
		return err
	}
	for _, p := range protected {
		r, err := resolve(p)
		if err != nil {
			return err
		}
		if within(d, r) || within(r, d) {
			return fmt.Errorf("%s overlaps %s, which the export reads from; it would be deleted: choose a directory outside it", dir, p)
		}
	}
	return nil
}

// resolve makes path absolute and follows the symbolic links of its longest existing prefix,
// so that a link to the model, or a path through one, is recognised.
func resolve(path string) (string, error) {
	abs, err := filepath.Abs(path)
	if err != nil {
		return "", err
	}
	if real, err := filepath.EvalSymlinks(abs); err == nil {
		return real, nil
	}
	parent := filepath.Dir(abs)
	if parent == abs {
		return abs, nil
	}
	real, err := resolve(parent)
	if err != nil {
		return "", err
	}
	return filepath.Join(real, filepath.Base(abs)), nil
}

// within reports whether path is root or lies under it (both absolute and clean).
func within(root, path string) bool {
	rel, err := filepath.Rel(root, path)
	return err == nil && rel != ".." && !strings.HasPrefix(rel, ".."+string(filepath.Separator))
}

// sameVariables checks the serving model's variables are the training model's, object-based
// key for key (the keys ExportServing's transfer goes by).
func sameVariables(serving, training []VariableSpec) error {
	if len(serving) != len(training) {
		return fmt.Errorf("%d variables, the training model has %d", len(serving), len(training))
	}
	for i := range serving {
		s, t := serving[i], training[i]
		if s.Name != t.Name || s.ObjectKey != t.ObjectKey || !slices.Equal(s.Shape, t.Shape) {
			return fmt.Errorf("variable %d is %s%v (key %s), the training model's is %s%v (key %s)",
				i, s.Name, s.Shape, s.ObjectKey, t.Name, t.Shape, t.ObjectKey)
		}
	}
	return nil
}

// copyTree copies a file or a directory tree; a missing src is not an error.
func copyTree(src, dst string) error {
	return filepath.WalkDir(src, func(path string, d fs.DirEntry, err error) error {
		if errors.Is(err, fs.ErrNotExist) && path == src {
			return nil
		}
		if err != nil {
			return err
		}
		rel, err := filepath.Rel(src, path)
		if err != nil {
			return err
		}
		target := filepath.Join(dst, rel)
		if d.IsDir() {
			return os.MkdirAll(target, 0o755)
		}
		if err := os.MkdirAll(filepath.Dir(target), 0o755); err != nil {
			return err
		}
		return copyFile(path, target)
	})
}

func copyFile(src, dst string) error {
	in, err := os.Open(src)
	if err != nil {
		return err
	}
	defer in.Close()
	out, err := os.Create(dst)
	if err != nil {
		return err
	}
	if _, err := io.Copy(out, in); err != nil {
		out.Close()
		return err
	}
	return out.Close()
}
