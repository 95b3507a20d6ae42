// Package checkpoint keeps the training checkpoints of one output directory the way
// tf.train.Saver / tf.train.CheckpointManager do: files named model.ckpt-<global step>, the
// `checkpoint` state file in TensorFlow's text format (so tf.train.latest_checkpoint and
// TensorBoard find them), keep_checkpoint_max and keep_checkpoint_every_n_hours retention, and
// resumption from the latest one.
//
// Every save is atomic: the checkpoint is written into a temporary directory, its data files are
// renamed into place before its index (TensorFlow opens a checkpoint through the index), then
// the state file is replaced by rename, and only then are the checkpoints that retention drops
// deleted (tf.train.Saver's order). A crash at any point leaves a state file pointing at
// complete checkpoints.
package checkpoint

import (
	"bufio"
	"errors"
	"fmt"
	"log"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/gorovod/gorovod/tf/atomicfile"
	"github.com/gorovod/gorovod/tf/internal/walltime"
)

// StateFile is the name of TensorFlow's checkpoint state file.
const StateFile = "checkpoint"

// Basename is the checkpoint file prefix of run_classifier's Estimator.
const Basename = "model.ckpt"

// SaveFunc writes a TensorFlow checkpoint (prefix.index and prefix.data-*-of-*) under prefix,
// and any file of its own named prefix.<suffix>: those travel and are deleted with the checkpoint.
type SaveFunc func(prefix string) error

// Manager owns the checkpoints of one directory. It is not safe for concurrent use; rank 0's
// training loop is its only user.
type Manager struct {
	dir             string
	maxToKeep       int           // 0 keeps every checkpoint
	keepEvery       time.Duration // 0 preserves none beyond maxToKeep
	now             func() time.Time
	remove          func(path string) error     // os.Remove; tests inject failures
	rename          func(from, to string) error // os.Rename; tests inject failures
	kept            []entry                     // oldest first: the checkpoints listed in the state file
	lastPreserved   float64                     // unix seconds
	latestPrefixRel string

	// Warnf receives the warning of Latest when it falls back to an older checkpoint;
	// log.Printf when nil.
	Warnf func(format string, args ...any)
	// Verify, when set, checks a checkpoint whose files are all there before Latest returns it
	// (tf.VerifyCheckpoint reads it as a restore would); Latest passes over one it rejects as
	// damaged, as over one with files missing.
	Verify func(prefix string) error
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
	m := &Manager{dir: dir, maxToKeep: maxToKeep, now: now, remove: os.Remove, rename: os.Rename, lastPreserved: walltime.Seconds(now())}
	if keepEveryNHours > 0 && keepEveryNHours < 1e9 {
		m.keepEvery = time.Duration(keepEveryNHours * float64(time.Hour))
	}
	staleNames, err := listDir(dir, func(name string) bool {
		return strings.HasPrefix(name, "."+Basename+"-") && strings.Contains(name, ".tmp") ||
			strings.HasPrefix(name, "."+StateFile+".tmp")
	})
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		return nil, err
	}
	var stale []string
	for _, name := range staleNames {
		stale = append(stale, filepath.Join(dir, name))
	}
	partial, err := partialCheckpoints(dir)
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		return nil, err
	}
	stale = append(stale, partial...)
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

// Latest returns the prefix (absolute or relative to the working directory, usable by a restore)
// and global step of the newest checkpoint, or ok == false when the directory has none. When the
// files of the state file's model_checkpoint_path are missing, incomplete or damaged (Verify),
// it falls back to the newest checkpoint of all_model_checkpoint_paths that is sound, with a
// warning through Warnf naming what is wrong with each one passed over (the run then repeats
// the steps since); none sound is an error. The damaged files are left as they are (a later
// save of the same step replaces them). After a fall back, the manager's next saves treat that
// checkpoint as the latest, and the state file lists the sound checkpoints only.
func (m *Manager) Latest() (prefix string, step int64, ok bool, err error) {
	rel, passed, err := latest(m.dir, m.latestPrefixRel, m.relsOf(), m.Warnf, m.Verify)
	if err != nil || rel == "" {
		return "", 0, false, err
	}
	if rel != m.latestPrefixRel {
		m.latestPrefixRel = rel
		m.kept = slices.DeleteFunc(m.kept, func(e entry) bool { return passed[e.rel] || checkFiles(m.resolve(e.rel)) != nil })
	}
	return prefixStep(m.resolve(rel))
}

func (m *Manager) relsOf() []string {
	out := make([]string, len(m.kept))
	for i, e := range m.kept {
		out[i] = e.rel
	}
	return out
}

// Latest reads the newest checkpoint of dir as Manager.Latest does (warning through log.Printf),
// without opening a manager: for observers, which must not clean up after a save that may be in
// flight.
func Latest(dir string) (prefix string, step int64, ok bool, err error) {
	st, err := readState(filepath.Join(dir, StateFile))
	if errors.Is(err, os.ErrNotExist) {
		return "", 0, false, nil
	}
	if err != nil {
		return "", 0, false, err
	}
	rel, _, err := latest(dir, st.latest, st.all, nil, nil)
	if err != nil || rel == "" {
		return "", 0, false, err
	}
	return prefixStep(resolve(dir, rel))
}

// latest picks the state file's model_checkpoint_path rel when it is sound (sound: checkFiles,
// then verify when not nil), else the newest sound one of all (oldest first), warning through
// warnf with what is wrong with each checkpoint passed over. It returns "" for none, and the
// checkpoints passed over.
func latest(dir, rel string, all []string, warnf func(string, ...any), verify func(string) error) (string, map[string]bool, error) {
	if rel == "" {
		return "", nil, nil
	}
	sound := func(rel string) error {
		p := resolve(dir, rel)
		if err := checkFiles(p); err != nil || verify == nil {
			return err
		}
		return verify(p)
	}
	problem := sound(rel)
	if problem == nil {
		return rel, nil, nil
	}
	passed := map[string]bool{rel: true}
	problems := []string{fmt.Sprintf("%s: %v", rel, problem)}
	for i := len(all) - 1; i >= 0; i-- {
		if passed[all[i]] {
			continue
		}
		if err := sound(all[i]); err != nil {
			passed[all[i]] = true
			problems = append(problems, fmt.Sprintf("%s: %v", all[i], err))
			continue
		}
		if warnf == nil {
			warnf = log.Printf
		}
		warnf("warning: %s names %s as the latest checkpoint, but it is incomplete or damaged; falling back to %s, the newest sound one it lists (the damaged files are left as they are):\n  %s",
			filepath.Join(dir, StateFile), rel, all[i], strings.Join(problems, "\n  "))
		return all[i], passed, nil
	}
	return "", nil, fmt.Errorf("checkpoint: %s names %s, which is not readable (%w), and lists no other sound checkpoint: put the checkpoint's files back, or remove %s to start from the beginning",
		filepath.Join(dir, StateFile), resolve(dir, rel), problem, filepath.Join(dir, StateFile))
}

// checkFiles reports the first missing file of the checkpoint prefix: its index, or one of the
// data shards prefix.data-<i>-of-<n>.
func checkFiles(prefix string) error {
	if _, err := os.Stat(prefix + ".index"); err != nil {
		return err
	}
	shards, err := DataShards(prefix)
	if err != nil {
		return err
	}
	if len(shards) == 0 {
		return fmt.Errorf("%s.data-00000-of-* is missing", prefix)
	}
	n, _ := strconv.Atoi(shards[0][len(shards[0])-5:]) // DataShards matched five digits
	for i := range n {
		shard := fmt.Sprintf("%s.data-%05d-of-%05d", prefix, i, n)
		if _, err := os.Stat(shard); err != nil {
			return err
		}
	}
	return nil
}

func prefixStep(prefix string) (string, int64, bool, error) {
	step, err := StepOf(prefix)
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

// IsLatest says whether the latest checkpoint is that of global step step, so that Save would
// write nothing.
func (m *Manager) IsLatest(step int64) bool {
	return m.latestPrefixRel != "" && m.sameCheckpoint(m.latestPrefixRel, fmt.Sprintf("%s-%d", Basename, step))
}

// sameCheckpoint says whether two prefixes of the state file name one checkpoint: TensorFlow's
// v1 Saver writes absolute paths where this manager writes them relative to its directory.
func (m *Manager) sameCheckpoint(a, b string) bool {
	pa, errA := filepath.Abs(m.resolve(a))
	pb, errB := filepath.Abs(m.resolve(b))
	return errA == nil && errB == nil && pa == pb
}

// StepOf returns the global step encoded in a checkpoint prefix (model.ckpt-1200 -> 1200).
func StepOf(prefix string) (int64, error) {
	m := stepSuffix.FindStringSubmatch(prefix)
	if m == nil {
		return 0, fmt.Errorf("checkpoint: %s does not end in -<global step>", prefix)
	}
	step, err := strconv.ParseInt(m[1], 10, 64)
	if err != nil {
		return 0, fmt.Errorf("checkpoint: the global step of %s: %w", prefix, err)
	}
	return step, nil
}

// Save writes the checkpoint of global step step through save, makes it the latest, and deletes
// the checkpoints that retention no longer keeps. Saving a step that is already the latest
// checkpoint does nothing (the final save often coincides with a periodic one).
func (m *Manager) Save(step int64, save SaveFunc) (string, error) {
	rel := fmt.Sprintf("%s-%d", Basename, step)
	final := filepath.Join(m.dir, rel)
	if m.IsLatest(step) {
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
	if err := m.moveCheckpoint(tmpDir, rel); err != nil {
		return "", err
	}
	// Remove older entries of the same checkpoint (a restart that re-saves the same step),
	// however the state file spelled them: retention would otherwise delete the files of this
	// save through one of them.
	m.kept = slices.DeleteFunc(m.kept, func(e entry) bool { return m.sameCheckpoint(e.rel, rel) })
	m.kept = append(m.kept, entry{rel: rel, time: walltime.Seconds(m.now())})
	m.latestPrefixRel = rel
	dropped := m.retain()
	// The state file first: a crash before the deletions leaves files no state names, never a
	// state that names deleted files.
	if err := m.writeState(); err != nil {
		return "", err
	}
	for _, prefix := range dropped {
		if err := m.deleteCheckpoint(prefix); err != nil {
			return "", err
		}
	}
	return final, nil
}

// moveCheckpoint renames the files of tmpDir/rel.* into the manager's directory: the data
// shards first, the index last, each synced, then the directory. When a rename fails, the files
// already moved are removed again, so that no partial checkpoint stays behind.
func (m *Manager) moveCheckpoint(tmpDir, rel string) (err error) {
	files, err := Files(filepath.Join(tmpDir, rel))
	if err != nil {
		return err
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
	var moved []string
	defer func() {
		if err == nil {
			return
		}
		for _, f := range moved {
			if rerr := m.remove(f); rerr != nil && !errors.Is(rerr, os.ErrNotExist) {
				err = errors.Join(err, fmt.Errorf("checkpoint: removing the partial checkpoint: %w", rerr))
			}
		}
	}()
	for _, f := range append(data, index) {
		if err := syncFile(f); err != nil {
			return err
		}
		to := filepath.Join(m.dir, filepath.Base(f))
		if err := m.rename(f, to); err != nil {
			return fmt.Errorf("checkpoint: %w", err)
		}
		moved = append(moved, to)
	}
	return atomicfile.SyncDir(m.dir)
}

// partialCheckpoints lists the files of the checkpoints of dir that have no index: the index is
// moved into place last, so these are what a save killed while moving its files left behind.
// TensorFlow cannot open them and no state file names them as complete.
func partialCheckpoints(dir string) ([]string, error) {
	names, err := listDir(dir, checkpointFile.MatchString)
	if err != nil {
		return nil, err
	}
	var partial []string
	for _, name := range names {
		m := checkpointFile.FindStringSubmatch(name)
		if _, err := os.Stat(filepath.Join(dir, m[1]+".index")); errors.Is(err, os.ErrNotExist) {
			partial = append(partial, filepath.Join(dir, name))
		}
	}
	return partial, nil
}

// checkpointFile matches the name of a checkpoint's file; group 1 is its prefix.
var checkpointFile = regexp.MustCompile(`^(` + regexp.QuoteMeta(Basename) + `-\d+)\.`)

// retain applies keep_checkpoint_max and keep_checkpoint_every_n_hours as
// tf.train.CheckpointManager does: beyond the newest maxToKeep, a checkpoint at least keepEvery
// newer than the last preserved one is kept on disk (and leaves the state file), the others leave
// the state file and are returned, to be deleted once the state file no longer lists them.
// Only checkpoints of the manager's directory are deleted: a state file may list others (one
// copied from elsewhere, or edited to resume from another run's checkpoint), and those leave
// the list but stay on disk.
func (m *Manager) retain() (dropped []string) {
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
		if m.owns(old.rel) {
			dropped = append(dropped, m.resolve(old.rel))
		}
	}
	return dropped
}

// owns says whether the checkpoint rel of the state file lies in the manager's directory.
func (m *Manager) owns(rel string) bool {
	dir, err := filepath.Abs(m.dir)
	if err != nil {
		return false
	}
	prefix, err := filepath.Abs(m.resolve(rel))
	return err == nil && filepath.Dir(prefix) == dir
}

// deleteCheckpoint removes the files of prefix that the save wrote beside its index (the data
// shards and whatever else the SaveFunc put there), then its index.
func (m *Manager) deleteCheckpoint(prefix string) error {
	files, err := Files(prefix)
	if err != nil {
		return err
	}
	files = slices.DeleteFunc(files, func(f string) bool { return f == prefix+".index" })
	for _, f := range append(files, prefix+".index") {
		if err := m.remove(f); err != nil && !errors.Is(err, os.ErrNotExist) {
			return fmt.Errorf("checkpoint: deleting old checkpoint: %w", err)
		}
	}
	return nil
}

// Files lists the files of the checkpoint prefix: those of its directory named
// <base name of prefix>.<suffix> (the index, the data shards, the files a SaveFunc added).
// The directory is read and the names compared as strings: prefix is a user's path, and a
// glob pattern made of it would read any [, * or ? in it as a wildcard.
// The paths returned are prefix followed by the suffix, as spelt by the caller.
func Files(prefix string) ([]string, error) {
	base := filepath.Base(prefix)
	names, err := listDir(filepath.Dir(prefix), func(name string) bool { return strings.HasPrefix(name, base+".") })
	if err != nil {
		return nil, err
	}
	for i, name := range names {
		names[i] = prefix + name[len(base):]
	}
	return names, nil
}

// ResolvePrefix turns what run_classifier's --init_checkpoint accepts into a checkpoint
// prefix: a prefix itself; a directory, through the model_checkpoint_path of its state file (as
// tf.train.latest_checkpoint resolves it); or one of the checkpoint's files, whose .index or
// .data-<i>-of-<n> suffix is dropped. The prefix's index must exist; the error names each path
// tried.
func ResolvePrefix(path string) (string, error) {
	if st, err := os.Stat(path); err == nil && st.IsDir() {
		state := filepath.Join(path, StateFile)
		st, err := readState(state)
		if err != nil {
			return "", fmt.Errorf("%s is a directory, and its checkpoint state file does not name a checkpoint: %w", path, err)
		}
		prefix := resolve(path, st.latest)
		if _, err := os.Stat(prefix + ".index"); err != nil {
			return "", fmt.Errorf("%s is a directory whose %s names %s, which has no index: %w", path, state, prefix, err)
		}
		return prefix, nil
	}
	prefix := path
	if p, ok := strings.CutSuffix(path, ".index"); ok {
		prefix = p
	} else if m := dataShardOf.FindStringIndex(path); m != nil {
		prefix = path[:m[0]]
	}
	if _, err := os.Stat(prefix + ".index"); err != nil {
		if prefix != path {
			return "", fmt.Errorf("%s names a file of checkpoint %s, which has no index: %w", path, prefix, err)
		}
		return "", fmt.Errorf("%s is neither a checkpoint prefix (no %s.index: %v) nor a directory with a %s state file", path, path, err, StateFile)
	}
	return prefix, nil
}

// dataShardOf finds the data shard suffix at the end of a checkpoint file's path.
var dataShardOf = regexp.MustCompile(`\.data-\d{5}-of-\d{5}$`)

// DataShards lists the data shards prefix.data-<i>-of-<n> of the checkpoint prefix, sorted.
func DataShards(prefix string) ([]string, error) {
	files, err := Files(prefix)
	if err != nil {
		return nil, err
	}
	return slices.DeleteFunc(files, func(f string) bool {
		m := dataShardOf.FindStringIndex(f)
		return m == nil || m[0] != len(prefix)
	}), nil
}

// listDir returns the names of the entries of dir that match, sorted.
func listDir(dir string, match func(name string) bool) ([]string, error) {
	entries, err := os.ReadDir(dir)
	if err != nil {
		return nil, fmt.Errorf("checkpoint: %w", err)
	}
	var out []string
	for _, e := range entries {
		if match(e.Name()) {
			out = append(out, e.Name())
		}
	}
	return out, nil
}

func (m *Manager) resolve(rel string) string { return resolve(m.dir, rel) }

func resolve(dir, rel string) string {
	if filepath.IsAbs(rel) {
		return rel
	}
	return filepath.Join(dir, rel)
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
		// Text format allows blanks before the colon (TensorFlow reads "field : value").
		key, value = strings.TrimSpace(key), strings.TrimSpace(value)
		bad := func(err error) error {
			return fmt.Errorf("checkpoint: %s:%d: bad value of %s: %v", path, line, key, err)
		}
		switch key {
		case "model_checkpoint_path", "all_model_checkpoint_paths":
			s, err := unquoteText(value)
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

// unquoteText reads a string of protobuf's text format: double- or single-quoted, with C's
// escapes, which include \' (TensorFlow writes a path holding an apostrophe that way, which Go's
// double-quoted syntax does not accept).
func unquoteText(v string) (string, error) {
	if len(v) < 2 || (v[0] != '"' && v[0] != '\'') || v[len(v)-1] != v[0] {
		return "", fmt.Errorf("%s is not a quoted string", v)
	}
	var b strings.Builder
	b.WriteByte('"')
	body := v[1 : len(v)-1]
	for i := 0; i < len(body); i++ {
		switch c := body[i]; {
		case c == '\\' && i+1 < len(body) && body[i+1] == '\'':
			b.WriteByte('\'')
			i++
		case c == '\\' && i+1 < len(body):
			b.WriteString(body[i : i+2])
			i++
		case c == '"': // inside single quotes
			b.WriteString(`\"`)
		default:
			b.WriteByte(c)
		}
	}
	b.WriteByte('"')
	return strconv.Unquote(b.String())
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
