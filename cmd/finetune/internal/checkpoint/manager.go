// Package checkpoint keeps the training checkpoints of one output directory the way
// tf.train.Saver / tf.train.CheckpointManager do: files named model.ckpt-<global step>, the
// `checkpoint` state file in TensorFlow's text format (so tf.train.latest_checkpoint and
// TensorBoard find them), keep_checkpoint_max and keep_checkpoint_every_n_hours retention, and
// resumption from the latest one.
//
// Every save is atomic: the checkpoint is written into a temporary directory, its data files are
// renamed into place before its index (TensorFlow opens a checkpoint through the index), and the
// state file is replaced last, by rename. A crash at any point leaves the previous state file
// pointing at a complete checkpoint.
package checkpoint

import (
	"bufio"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"time"

	"github.com/gorovod/gorovod/cmd/finetune/internal/atomicfile"
)

// StateFile is the name of TensorFlow's checkpoint state file.
const StateFile = "checkpoint"

// Basename is the checkpoint file prefix of run_classifier's Estimator.
const Basename = "model.ckpt"

// SaveFunc writes a TensorFlow checkpoint (prefix.index and prefix.data-*-of-*) under prefix.
type SaveFunc func(prefix string) error

// Manager owns the checkpoints of one directory. It is not safe for concurrent use; rank 0's
// training loop is its only user.
type Manager struct {
	dir             string
	maxToKeep       int           // 0 keeps every checkpoint
	keepEvery       time.Duration // 0 preserves none beyond maxToKeep
	now             func() time.Time
	kept            []entry // oldest first: the checkpoints listed in the state file
	lastPreserved   float64 // unix seconds
	latestPrefixRel string
}

type entry struct {
	rel  string  // path relative to dir, as written into the state file
	time float64 // unix seconds of the save
}

// Open reads the state file of dir if there is one, and removes what interrupted saves left
// behind. maxToKeep is keep_checkpoint_max (0 keeps all), keepEveryNHours is
// keep_checkpoint_every_n_hours (0 or +Inf disables the preservation).
func Open(dir string, maxToKeep int, keepEveryNHours float64) (*Manager, error) {
	return open(dir, maxToKeep, keepEveryNHours, time.Now)
}

func open(dir string, maxToKeep int, keepEveryNHours float64, now func() time.Time) (*Manager, error) {
	if maxToKeep < 0 {
		return nil, fmt.Errorf("checkpoint: keep_checkpoint_max %d is negative", maxToKeep)
	}
	if keepEveryNHours < 0 {
		return nil, fmt.Errorf("checkpoint: keep_checkpoint_every_n_hours %v is negative", keepEveryNHours)
	}
	m := &Manager{dir: dir, maxToKeep: maxToKeep, now: now, lastPreserved: unixSeconds(now())}
	if keepEveryNHours > 0 && keepEveryNHours < 1e9 {
		m.keepEvery = time.Duration(keepEveryNHours * float64(time.Hour))
	}
	stale, _ := filepath.Glob(filepath.Join(dir, "."+Basename+"-*.tmp*"))
	staleState, _ := filepath.Glob(filepath.Join(dir, "."+StateFile+".tmp*"))
	stale = append(stale, staleState...)
	for _, s := range stale {
		if err := os.RemoveAll(s); err != nil {
			return nil, fmt.Errorf("checkpoint: removing an interrupted save: %w", err)
		}
	}
	st, err := readState(filepath.Join(dir, StateFile))
	if errors.Is(err, os.ErrNotExist) {
		return m, nil
	}
	if err != nil {
		return nil, err
	}
	m.latestPrefixRel = st.latest
	for i, p := range st.all {
		e := entry{rel: p}
		if i < len(st.timestamps) {
			e.time = st.timestamps[i]
		}
		m.kept = append(m.kept, e)
	}
	if st.lastPreserved > 0 {
		m.lastPreserved = st.lastPreserved
	}
	return m, nil
}

// Dir returns the directory the manager writes into.
func (m *Manager) Dir() string { return m.dir }

// Latest returns the prefix (absolute or relative to the working directory, usable by a restore)
// and global step of the newest checkpoint, or ok == false when the directory has none. A state
// file that names a checkpoint whose index is missing is an error: resuming from an older one
// silently would repeat training steps.
func (m *Manager) Latest() (prefix string, step int64, ok bool, err error) {
	return latest(m.dir, m.latestPrefixRel)
}

// Latest reads the newest checkpoint of dir as Manager.Latest does, without opening a manager:
// for observers, which must not clean up after a save that may be in flight.
func Latest(dir string) (prefix string, step int64, ok bool, err error) {
	st, err := readState(filepath.Join(dir, StateFile))
	if errors.Is(err, os.ErrNotExist) {
		return "", 0, false, nil
	}
	if err != nil {
		return "", 0, false, err
	}
	return latest(dir, st.latest)
}

func latest(dir, rel string) (prefix string, step int64, ok bool, err error) {
	if rel == "" {
		return "", 0, false, nil
	}
	prefix = rel
	if !filepath.IsAbs(rel) {
		prefix = filepath.Join(dir, rel)
	}
	if _, err := os.Stat(prefix + ".index"); err != nil {
		return "", 0, false, fmt.Errorf("checkpoint: %s names %s, which is not readable: %w",
			filepath.Join(dir, StateFile), prefix, err)
	}
	step, err = StepOf(prefix)
	if err != nil {
		return "", 0, false, err
	}
	return prefix, step, true, nil
}

// Kept returns the prefixes listed in the state file, oldest first.
func (m *Manager) Kept() []string {
	out := make([]string, len(m.kept))
	for i, e := range m.kept {
		out[i] = m.resolve(e.rel)
	}
	return out
}

var stepSuffix = regexp.MustCompile(`-(\d+)$`)

// StepOf returns the global step encoded in a checkpoint prefix (model.ckpt-1200 -> 1200).
func StepOf(prefix string) (int64, error) {
	m := stepSuffix.FindStringSubmatch(prefix)
	if m == nil {
		return 0, fmt.Errorf("checkpoint: %s does not end in -<global step>", prefix)
	}
	return strconv.ParseInt(m[1], 10, 64)
}

// Save writes the checkpoint of global step step through save, makes it the latest, and deletes
// the checkpoints that retention no longer keeps. Saving a step that is already the latest
// checkpoint does nothing (the final save often coincides with a periodic one).
func (m *Manager) Save(step int64, save SaveFunc) (string, error) {
	rel := fmt.Sprintf("%s-%d", Basename, step)
	final := filepath.Join(m.dir, rel)
	if m.latestPrefixRel == rel {
		return final, nil
	}
	tmpDir, err := os.MkdirTemp(m.dir, "."+rel+".tmp")
	if err != nil {
		return "", fmt.Errorf("checkpoint: %w", err)
	}
	defer os.RemoveAll(tmpDir)
	if err := save(filepath.Join(tmpDir, rel)); err != nil {
		return "", fmt.Errorf("checkpoint: saving step %d: %w", step, err)
	}
	if err := moveCheckpoint(tmpDir, rel, m.dir); err != nil {
		return "", err
	}
	// Remove an older entry of the same name (a restart that re-saves the same step).
	for i, e := range m.kept {
		if e.rel == rel {
			m.kept = append(m.kept[:i], m.kept[i+1:]...)
			break
		}
	}
	m.kept = append(m.kept, entry{rel: rel, time: unixSeconds(m.now())})
	m.latestPrefixRel = rel
	if err := m.sweep(); err != nil {
		return "", err
	}
	if err := m.writeState(); err != nil {
		return "", err
	}
	return final, nil
}

// moveCheckpoint renames the files of tmpDir/rel.* into dir: the data shards first, the index
// last, each synced, then the directory.
func moveCheckpoint(tmpDir, rel, dir string) error {
	files, err := filepath.Glob(filepath.Join(tmpDir, rel+".*"))
	if err != nil {
		return fmt.Errorf("checkpoint: %w", err)
	}
	var index string
	var data []string
	for _, f := range files {
		if strings.HasSuffix(f, ".index") {
			index = f
		} else {
			data = append(data, f)
		}
	}
	if index == "" || len(data) == 0 {
		return fmt.Errorf("checkpoint: the saver wrote no %s.index and .data files (found %v)", rel, files)
	}
	for _, f := range append(data, index) {
		if err := syncFile(f); err != nil {
			return err
		}
		if err := os.Rename(f, filepath.Join(dir, filepath.Base(f))); err != nil {
			return fmt.Errorf("checkpoint: %w", err)
		}
	}
	return atomicfile.SyncDir(dir)
}

// sweep applies keep_checkpoint_max and keep_checkpoint_every_n_hours as
// tf.train.CheckpointManager does: beyond the newest maxToKeep, a checkpoint at least keepEvery
// newer than the last preserved one is kept on disk (and leaves the state file), others are deleted.
func (m *Manager) sweep() error {
	if m.maxToKeep == 0 {
		return nil
	}
	for len(m.kept) > m.maxToKeep {
		old := m.kept[0]
		m.kept = m.kept[1:]
		if m.keepEvery > 0 && old.time-m.keepEvery.Seconds() >= m.lastPreserved {
			m.lastPreserved = old.time
			continue
		}
		prefix := m.resolve(old.rel)
		files, _ := filepath.Glob(prefix + ".data-?????-of-?????")
		for _, f := range append(files, prefix+".index") {
			if err := os.Remove(f); err != nil && !errors.Is(err, os.ErrNotExist) {
				return fmt.Errorf("checkpoint: deleting old checkpoint: %w", err)
			}
		}
	}
	return nil
}

func (m *Manager) resolve(rel string) string {
	if filepath.IsAbs(rel) {
		return rel
	}
	return filepath.Join(m.dir, rel)
}

// writeState replaces the state file by rename, in the text format of TensorFlow's
// CheckpointState proto.
func (m *Manager) writeState() error {
	var b strings.Builder
	fmt.Fprintf(&b, "model_checkpoint_path: %s\n", strconv.Quote(m.latestPrefixRel))
	for _, e := range m.kept {
		fmt.Fprintf(&b, "all_model_checkpoint_paths: %s\n", strconv.Quote(e.rel))
	}
	for _, e := range m.kept {
		fmt.Fprintf(&b, "all_model_checkpoint_timestamps: %s\n", strconv.FormatFloat(e.time, 'f', -1, 64))
	}
	fmt.Fprintf(&b, "last_preserved_timestamp: %s\n", strconv.FormatFloat(m.lastPreserved, 'f', -1, 64))
	return atomicfile.Write(filepath.Join(m.dir, StateFile), []byte(b.String()))
}

type state struct {
	latest        string
	all           []string
	timestamps    []float64
	lastPreserved float64
}

// readState parses the fields of a CheckpointState text proto; TensorFlow's own writers produce
// one `field: value` per line.
func readState(path string) (state, error) {
	f, err := os.Open(path)
	if err != nil {
		return state{}, fmt.Errorf("checkpoint: %w", err)
	}
	defer f.Close()
	var st state
	sc := bufio.NewScanner(f)
	for line := 1; sc.Scan(); line++ {
		text := strings.TrimSpace(sc.Text())
		if text == "" || strings.HasPrefix(text, "#") {
			continue
		}
		key, value, found := strings.Cut(text, ":")
		if !found {
			return state{}, fmt.Errorf("checkpoint: %s:%d: no `field: value` in %q", path, line, text)
		}
		value = strings.TrimSpace(value)
		bad := func(err error) error {
			return fmt.Errorf("checkpoint: %s:%d: bad value of %s: %v", path, line, key, err)
		}
		switch strings.TrimSpace(key) {
		case "model_checkpoint_path", "all_model_checkpoint_paths":
			s, err := strconv.Unquote(value)
			if err != nil {
				return state{}, bad(err)
			}
			if key == "model_checkpoint_path" {
				st.latest = s
			} else {
				st.all = append(st.all, s)
			}
		case "all_model_checkpoint_timestamps", "last_preserved_timestamp":
			v, err := strconv.ParseFloat(value, 64)
			if err != nil {
				return state{}, bad(err)
			}
			if key == "last_preserved_timestamp" {
				st.lastPreserved = v
			} else {
				st.timestamps = append(st.timestamps, v)
			}
		default:
			return state{}, fmt.Errorf("checkpoint: %s:%d: unknown field %q", path, line, key)
		}
	}
	if err := sc.Err(); err != nil {
		return state{}, fmt.Errorf("checkpoint: %s: %w", path, err)
	}
	if st.latest == "" {
		return state{}, fmt.Errorf("checkpoint: %s has no model_checkpoint_path", path)
	}
	return st, nil
}

func syncFile(path string) error {
	f, err := os.Open(path)
	if err != nil {
		return fmt.Errorf("checkpoint: %w", err)
	}
	defer f.Close()
	if err := f.Sync(); err != nil {
		return fmt.Errorf("checkpoint: syncing %s: %w", path, err)
	}
	return nil
}

func unixSeconds(t time.Time) float64 { return float64(t.UnixNano()) / 1e9 }
