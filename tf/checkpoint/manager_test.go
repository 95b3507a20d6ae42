package checkpoint

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/gorovod/gorovod/tf/testenv"
)

// fakeSave writes the two files of a V2 checkpoint with recognisable contents.
func fakeSave(content string) SaveFunc {
	return func(prefix string) error {
		if err := os.WriteFile(prefix+".data-00000-of-00001", []byte(content), 0o644); err != nil {
			return err
		}
		return os.WriteFile(prefix+".index", []byte("index "+content), 0o644)
	}
}

type clock struct{ t time.Time }

func (c *clock) now() time.Time { return c.t }

func listCheckpoints(t *testing.T, dir string) []string {
	t.Helper()
	entries, err := os.ReadDir(dir) // not a glob: tests use directory names with [, * and ?
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, e := range entries {
		if name, ok := strings.CutSuffix(e.Name(), ".index"); ok {
			out = append(out, name)
		}
	}
	return out
}

// TestDirectoryNameWithGlobCharacters runs every file listing of the manager in a directory
// whose name a glob pattern would read as wildcards: the final save of a run in --output_dir
// 'o[1]' once found none of the files its saver had just written.
func TestDirectoryNameWithGlobCharacters(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "o[1]*?")
	if err := os.Mkdir(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	// What interrupted saves leave behind, for Open to remove.
	debris := []string{".model.ckpt-5.tmp123", ".checkpoint.tmp456", "model.ckpt-7.data-00000-of-00001"}
	for _, name := range debris {
		if err := os.WriteFile(filepath.Join(dir, name), nil, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	m, err := Open(dir, 2, 0)
	if err != nil {
		t.Fatal(err)
	}
	for _, name := range debris {
		if _, err := os.Stat(filepath.Join(dir, name)); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("Open left %s (stat: %v)", name, err)
		}
	}
	withSidecar := func(prefix string) error {
		if err := fakeSave("s")(prefix); err != nil {
			return err
		}
		return os.WriteFile(prefix+".input_position.json", []byte("{}"), 0o644)
	}
	for _, step := range []int64{1, 2, 3} {
		if _, err := m.Save(step, withSidecar); err != nil {
			t.Fatal(err)
		}
	}
	if got, want := listCheckpoints(t, dir), []string{"model.ckpt-2", "model.ckpt-3"}; !reflect.DeepEqual(got, want) {
		t.Fatalf("on disk %v, want %v", got, want)
	}
	if _, err := os.Stat(filepath.Join(dir, "model.ckpt-1.input_position.json")); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("retention left the dropped checkpoint's sidecar (stat: %v)", err)
	}
	prefix := filepath.Join(dir, "model.ckpt-3")
	files, err := Files(prefix)
	if err != nil {
		t.Fatal(err)
	}
	if want := []string{prefix + ".data-00000-of-00001", prefix + ".index", prefix + ".input_position.json"}; !reflect.DeepEqual(files, want) {
		t.Errorf("Files = %v, want %v", files, want)
	}
	if shards, err := DataShards(prefix); err != nil || !reflect.DeepEqual(shards, files[:1]) {
		t.Errorf("DataShards = %v, %v; want %v", shards, err, files[:1])
	}
	// The newest checkpoint loses its data shard: Latest falls back to the other one, which it
	// can only find complete by listing the directory.
	if err := os.Remove(prefix + ".data-00000-of-00001"); err != nil {
		t.Fatal(err)
	}
	m.Warnf = func(string, ...any) {}
	got, step, ok, err := m.Latest()
	if err != nil || !ok || step != 2 || got != filepath.Join(dir, "model.ckpt-2") {
		t.Fatalf("Latest = %q, %d, %v, %v; want model.ckpt-2 in %s", got, step, ok, err, dir)
	}
}

func TestListingErrorsAreReported(t *testing.T) {
	if _, err := Files(filepath.Join(t.TempDir(), "missing", "model.ckpt-1")); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("Files of a missing directory: %v, want ErrNotExist", err)
	}
}

func TestKeepMaxDeletesOldestAndResumesFromLatest(t *testing.T) {
	dir := t.TempDir()
	m, err := Open(dir, 2, 0)
	if err != nil {
		t.Fatal(err)
	}
	if _, _, ok, err := m.Latest(); ok || err != nil {
		t.Fatalf("empty dir: ok=%v err=%v", ok, err)
	}
	for _, step := range []int64{10, 20, 30} {
		if _, err := m.Save(step, fakeSave("s")); err != nil {
			t.Fatal(err)
		}
	}
	if got, want := listCheckpoints(t, dir), []string{"model.ckpt-20", "model.ckpt-30"}; !reflect.DeepEqual(got, want) {
		t.Fatalf("on disk %v, want %v", got, want)
	}
	// A new manager (a restarted run) finds the latest and keeps counting retention from the file.
	m2, err := Open(dir, 2, 0)
	if err != nil {
		t.Fatal(err)
	}
	prefix, step, ok, err := m2.Latest()
	if err != nil || !ok || step != 30 || prefix != filepath.Join(dir, "model.ckpt-30") {
		t.Fatalf("Latest = %q %d %v %v", prefix, step, ok, err)
	}
	if _, err := m2.Save(40, fakeSave("s")); err != nil {
		t.Fatal(err)
	}
	if got, want := listCheckpoints(t, dir), []string{"model.ckpt-30", "model.ckpt-40"}; !reflect.DeepEqual(got, want) {
		t.Fatalf("after restart on disk %v, want %v", got, want)
	}
	// Saving the latest step again is a no-op (the final save after a periodic one).
	if !m2.IsLatest(40) || m2.IsLatest(30) {
		t.Fatalf("IsLatest(40) = %v, IsLatest(30) = %v after saving 40", m2.IsLatest(40), m2.IsLatest(30))
	}
	called := false
	if _, err := m2.Save(40, func(string) error { called = true; return nil }); err != nil || called {
		t.Fatalf("re-save of the latest step: called=%v err=%v", called, err)
	}
}

// A state file may list checkpoints of other directories (here: one by absolute path, one by a
// path relative to the output directory); retention drops them from the list and never deletes
// their files.
func TestRetentionDeletesOnlyCheckpointsOfItsDirectory(t *testing.T) {
	root := t.TempDir()
	out, elsewhere := filepath.Join(root, "out"), filepath.Join(root, "elsewhere")
	for _, d := range []string{out, elsewhere} {
		if err := os.Mkdir(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	foreign := []string{filepath.Join(elsewhere, "model.ckpt-10"), filepath.Join(elsewhere, "model.ckpt-11")}
	for _, p := range foreign {
		if err := fakeSave("theirs")(p); err != nil {
			t.Fatal(err)
		}
	}
	state := fmt.Sprintf("model_checkpoint_path: %q\nall_model_checkpoint_paths: %q\nall_model_checkpoint_paths: %q\n",
		"../elsewhere/model.ckpt-11", foreign[0], "../elsewhere/model.ckpt-11")
	if err := os.WriteFile(filepath.Join(out, StateFile), []byte(state), 0o644); err != nil {
		t.Fatal(err)
	}
	m, err := Open(out, 1, 0)
	if err != nil {
		t.Fatal(err)
	}
	if prefix, step, ok, err := m.Latest(); err != nil || !ok || step != 11 || prefix != filepath.Join(out, "../elsewhere/model.ckpt-11") {
		t.Fatalf("Latest = %q, %d, %v, %v", prefix, step, ok, err)
	}
	for _, step := range []int64{20, 30} {
		if _, err := m.Save(step, fakeSave("ours")); err != nil {
			t.Fatal(err)
		}
	}
	for _, p := range foreign {
		for _, suffix := range []string{".index", ".data-00000-of-00001"} {
			if _, err := os.Stat(p + suffix); err != nil {
				t.Errorf("retention deleted a checkpoint outside %s: %v", out, err)
			}
		}
	}
	if got, want := listCheckpoints(t, out), []string{"model.ckpt-30"}; !reflect.DeepEqual(got, want) {
		t.Errorf("in the output directory %v, want %v", got, want)
	}
	if got, want := m.Kept(), []string{filepath.Join(out, "model.ckpt-30")}; !reflect.DeepEqual(got, want) {
		t.Errorf("state lists %v, want %v", got, want)
	}
}

func TestKeepMaxZeroKeepsAll(t *testing.T) {
	dir := t.TempDir()
	m, _ := Open(dir, 0, 0)
	for step := int64(1); step <= 7; step++ {
		if _, err := m.Save(step, fakeSave("s")); err != nil {
			t.Fatal(err)
		}
	}
	if n := len(listCheckpoints(t, dir)); n != 7 {
		t.Fatalf("%d checkpoints kept, want 7", n)
	}
}

func TestKeepEveryNHoursPreservesSpacedCheckpoints(t *testing.T) {
	dir := t.TempDir()
	c := &clock{t: time.Unix(1_000_000, 0)}
	m, err := open(dir, 1, 1, c.now) // keep 1, plus one every hour
	if err != nil {
		t.Fatal(err)
	}
	// Saves every 20 minutes for 3 hours: steps 1..10 at t0+20m*step.
	for step := int64(1); step <= 10; step++ {
		c.t = time.Unix(1_000_000, 0).Add(time.Duration(step) * 20 * time.Minute)
		if _, err := m.Save(step, fakeSave("s")); err != nil {
			t.Fatal(err)
		}
	}
	// Preserved: the first save at least an hour after the manager's creation (step 3, t0+60m),
	// then every save an hour after the previous preserved one (6, 9); 10 is the one kept by max.
	want := []string{"model.ckpt-10", "model.ckpt-3", "model.ckpt-6", "model.ckpt-9"}
	if got := listCheckpoints(t, dir); !reflect.DeepEqual(got, want) {
		t.Fatalf("on disk %v, want %v", got, want)
	}
	if got := m.Kept(); len(got) != 1 || filepath.Base(got[0]) != "model.ckpt-10" {
		t.Fatalf("state lists %v, want only model.ckpt-10", got)
	}
}

func TestFailedSaveLeavesPreviousStateAndNoDebris(t *testing.T) {
	dir := t.TempDir()
	m, _ := Open(dir, 3, 0)
	if _, err := m.Save(5, fakeSave("good")); err != nil {
		t.Fatal(err)
	}
	before, _ := os.ReadFile(filepath.Join(dir, StateFile))
	boom := errors.New("disk full")
	_, err := m.Save(6, func(prefix string) error {
		os.WriteFile(prefix+".data-00000-of-00001", []byte("partial"), 0o644)
		return boom
	})
	if !errors.Is(err, boom) || !strings.Contains(err.Error(), "step 6") {
		t.Fatalf("err = %v", err)
	}
	after, _ := os.ReadFile(filepath.Join(dir, StateFile))
	if string(before) != string(after) {
		t.Fatalf("state changed by a failed save:\n%s\n->\n%s", before, after)
	}
	entries, _ := os.ReadDir(dir)
	for _, e := range entries {
		if strings.Contains(e.Name(), "tmp") || strings.Contains(e.Name(), "ckpt-6") {
			t.Errorf("debris left: %s", e.Name())
		}
	}
	// A saver that writes no index is refused rather than recorded.
	if _, err := m.Save(7, func(prefix string) error {
		return os.WriteFile(prefix+".data-00000-of-00001", nil, 0o644)
	}); err == nil || !strings.Contains(err.Error(), "index") {
		t.Fatalf("missing index: err = %v", err)
	}
}

func TestOpenRemovesInterruptedSavesAndRejectsDanglingState(t *testing.T) {
	dir := t.TempDir()
	stale := filepath.Join(dir, ".model.ckpt-9.tmp123")
	os.MkdirAll(stale, 0o755)
	os.WriteFile(filepath.Join(dir, StateFile), []byte(`model_checkpoint_path: "model.ckpt-9"`+"\n"), 0o644)
	m, err := Open(dir, 5, 0)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(stale); !os.IsNotExist(err) {
		t.Fatalf("interrupted save not removed: %v", err)
	}
	if _, _, _, err := m.Latest(); err == nil || !strings.Contains(err.Error(), "model.ckpt-9") {
		t.Fatalf("dangling state: err = %v", err)
	}
	os.WriteFile(filepath.Join(dir, StateFile), []byte("model_checkpoint_path \"x\"\n"), 0o644)
	if _, err := Open(dir, 5, 0); err == nil || !strings.Contains(err.Error(), "checkpoint:1") {
		t.Fatalf("garbled state: err = %v", err)
	}
}

// TensorFlow reads what the manager writes, and the manager reads what TensorFlow writes.
func TestStateFileInteroperatesWithTensorFlow(t *testing.T) {
	pyDir, goDir := t.TempDir(), t.TempDir()
	testenv.Python(t, `
import sys, tensorflow as tf
v = tf.Variable([1.5, -2.0, 3.25])
ckpt = tf.train.Checkpoint(v=v)
mgr = tf.train.CheckpointManager(ckpt, sys.argv[1], max_to_keep=2, checkpoint_name="model.ckpt")
for step in (3, 6, 9):
    mgr.save(checkpoint_number=step)
`, pyDir)
	m, err := Open(pyDir, 2, 0)
	if err != nil {
		t.Fatal(err)
	}
	prefix, step, ok, err := m.Latest()
	if err != nil || !ok || step != 9 {
		t.Fatalf("reading TensorFlow's state: %q %d %v %v", prefix, step, ok, err)
	}
	if got := m.Kept(); len(got) != 2 || filepath.Base(got[0]) != "model.ckpt-6" {
		t.Fatalf("kept %v", got)
	}

	// Our saves copy TensorFlow's real checkpoint files under each new prefix.
	g, _ := Open(goDir, 2, 0)
	for _, step := range []int64{100, 200, 300} {
		if _, err := g.Save(step, copyFrom(prefix)); err != nil {
			t.Fatal(err)
		}
	}
	out := testenv.Python(t, `
import json, os, sys, tensorflow as tf
d = sys.argv[1]
st = tf.train.get_checkpoint_state(d)
r = tf.train.load_checkpoint(d)
print(json.dumps({
  "latest": os.path.basename(tf.train.latest_checkpoint(d)),
  "all": [os.path.basename(p) for p in st.all_model_checkpoint_paths],
  "n_timestamps": len(st.all_model_checkpoint_timestamps),
  "v": r.get_tensor("v/.ATTRIBUTES/VARIABLE_VALUE").tolist(),
}))
`, goDir)
	var got struct {
		Latest      string
		All         []string
		NTimestamps int `json:"n_timestamps"`
		V           []float64
	}
	if err := json.Unmarshal(out, &got); err != nil {
		t.Fatalf("%v: %s", err, out)
	}
	if got.Latest != "model.ckpt-300" || !reflect.DeepEqual(got.All, []string{"model.ckpt-200", "model.ckpt-300"}) ||
		got.NTimestamps != 2 || !reflect.DeepEqual(got.V, []float64{1.5, -2, 3.25}) {
		t.Fatalf("TensorFlow read %+v", got)
	}
	// --init_checkpoint=DIR resolves to the checkpoint tf.train.latest_checkpoint(DIR) names.
	if resolved, err := ResolvePrefix(goDir); err != nil || filepath.Base(resolved) != got.Latest {
		t.Errorf("ResolvePrefix(%s) = %q, %v; TensorFlow's latest_checkpoint is %s", goDir, resolved, err, got.Latest)
	}
}

// TensorFlow's v1 Saver writes the state file with absolute paths, escaping an apostrophe as
// \' (protobuf's text format). Such a directory reads; a save of its latest step writes
// nothing, and retention deletes through the absolute entries without losing the files of a
// checkpoint the state file still lists.
func TestStateFileOfTensorFlowsV1Saver(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "o'b")
	testenv.Python(t, `
import sys, tensorflow as tf
tf.compat.v1.disable_eager_execution()
v = tf.compat.v1.Variable([1.5, -2.0, 3.25], name="v")
saver = tf.compat.v1.train.Saver(max_to_keep=2)
with tf.compat.v1.Session() as s:
    s.run(tf.compat.v1.global_variables_initializer())
    for step in (1, 2):
        saver.save(s, sys.argv[1] + "/model.ckpt", global_step=step)
`, dir)
	if b, _ := os.ReadFile(filepath.Join(dir, StateFile)); !strings.Contains(string(b), `o\'b/model.ckpt-2"`) {
		t.Fatalf("TensorFlow's state file no longer escapes the apostrophe with absolute paths: the test proves nothing:\n%s", b)
	}
	m, err := Open(dir, 2, 0)
	if err != nil {
		t.Fatal(err)
	}
	prefix, step, ok, err := m.Latest()
	if err != nil || !ok || step != 2 || prefix != filepath.Join(dir, "model.ckpt-2") {
		t.Fatalf("Latest: %q %d %v %v", prefix, step, ok, err)
	}
	if !m.IsLatest(2) {
		t.Error("IsLatest(2) false for the state file's absolute model.ckpt-2")
	}
	index := func(step int) string { return filepath.Join(dir, fmt.Sprintf("model.ckpt-%d.index", step)) }
	before, _ := os.Stat(index(2))
	if _, err := m.Save(2, func(string) error { return errors.New("a save of the latest step must not run") }); err != nil {
		t.Fatal(err)
	}
	if after, _ := os.Stat(index(2)); !after.ModTime().Equal(before.ModTime()) {
		t.Error("Save(2) rewrote the latest checkpoint")
	}
	for _, step := range []int64{3, 4} {
		if _, err := m.Save(step, copyFrom(prefix)); err != nil {
			t.Fatal(err)
		}
	}
	if kept := m.Kept(); len(kept) != 2 || filepath.Base(kept[0]) != "model.ckpt-3" || filepath.Base(kept[1]) != "model.ckpt-4" {
		t.Errorf("kept %v, want steps 3 and 4", kept)
	}
	for step, want := range map[int]bool{1: false, 2: false, 3: true, 4: true} {
		if _, err := os.Stat(index(step)); (err == nil) != want {
			t.Errorf("step %d's index: %v, want present %v", step, err, want)
		}
	}
}

// A state file edited by hand with blanks before the colons, which TensorFlow's text format
// reads (tf.train.get_checkpoint_state), reads alike here: each field where it belongs, where
// "model_checkpoint_path :" used to count as another of all_model_checkpoint_paths.
func TestStateFileWithBlanksBeforeColons(t *testing.T) {
	dir := t.TempDir()
	for _, name := range []string{"model.ckpt-1.index", "model.ckpt-1.data-00000-of-00001", "model.ckpt-2.index", "model.ckpt-2.data-00000-of-00001"} {
		if err := os.WriteFile(filepath.Join(dir, name), nil, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	text := "model_checkpoint_path : \"model.ckpt-1\"\nall_model_checkpoint_paths :\"model.ckpt-1\"\nall_model_checkpoint_paths: \"model.ckpt-2\"\n" +
		"all_model_checkpoint_timestamps : 5\nall_model_checkpoint_timestamps: 6\nlast_preserved_timestamp  :  7\n"
	if err := os.WriteFile(filepath.Join(dir, StateFile), []byte(text), 0o644); err != nil {
		t.Fatal(err)
	}
	st, err := readState(filepath.Join(dir, StateFile))
	if err != nil || st.latest != "model.ckpt-1" || !slices.Equal(st.all, []string{"model.ckpt-1", "model.ckpt-2"}) ||
		!slices.Equal(st.timestamps, []float64{5, 6}) || st.lastPreserved != 7 {
		t.Errorf("read %+v, %v", st, err)
	}
	if prefix, err := ResolvePrefix(dir); err != nil || prefix != filepath.Join(dir, "model.ckpt-1") {
		t.Errorf("ResolvePrefix: %q %v", prefix, err)
	}
}

// copyFrom is a SaveFunc that copies the single-shard checkpoint src under the new prefix.
func copyFrom(src string) SaveFunc {
	return func(prefix string) error {
		for _, ext := range []string{".index", ".data-00000-of-00001"} {
			b, err := os.ReadFile(src + ext)
			if err != nil {
				return err
			}
			if err := os.WriteFile(prefix+ext, b, 0o644); err != nil {
				return err
			}
		}
		return nil
	}
}

func TestResolvePrefix(t *testing.T) {
	dir := t.TempDir()
	prefix := filepath.Join(dir, "bert_model.ckpt")
	if err := fakeSave("s")(prefix); err != nil {
		t.Fatal(err)
	}
	for _, path := range []string{prefix, prefix + ".index", prefix + ".data-00000-of-00001"} {
		if got, err := ResolvePrefix(path); err != nil || got != prefix {
			t.Errorf("ResolvePrefix(%s) = %q, %v; want %s", path, got, err, prefix)
		}
	}
	// A state file's absolute path is taken as it is, a relative one from the directory.
	other := t.TempDir()
	os.WriteFile(filepath.Join(other, StateFile), []byte(fmt.Sprintf("model_checkpoint_path: %q\n", prefix)), 0o644)
	if got, err := ResolvePrefix(other); err != nil || got != prefix {
		t.Errorf("directory naming an absolute prefix: %q, %v", got, err)
	}
	os.WriteFile(filepath.Join(dir, StateFile), []byte(`model_checkpoint_path: "bert_model.ckpt"`+"\n"), 0o644)
	if got, err := ResolvePrefix(dir); err != nil || got != prefix {
		t.Errorf("directory naming a relative prefix: %q, %v", got, err)
	}
	empty := t.TempDir()
	for path, want := range map[string]string{
		prefix + "-9":                     prefix + "-9 is neither a checkpoint prefix (no " + prefix + "-9.index",
		prefix + "-9.index":               "names a file of checkpoint " + prefix + "-9, which has no index",
		prefix + "-9.data-00000-of-00002": "names a file of checkpoint " + prefix + "-9, which has no index",
		empty:                             empty + " is a directory, and its checkpoint state file does not name a checkpoint",
	} {
		if _, err := ResolvePrefix(path); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("ResolvePrefix(%s): %v, want %q", path, err, want)
		}
	}
	os.Remove(prefix + ".index")
	if _, err := ResolvePrefix(dir); err == nil || !strings.Contains(err.Error(), "names "+prefix+", which has no index") {
		t.Errorf("directory naming a checkpoint without index: %v", err)
	}
}

// An observer reading the latest checkpoint leaves a save in flight alone.
func TestLatestReadsWithoutCleaningUp(t *testing.T) {
	dir := t.TempDir()
	m, _ := Open(dir, 3, 0)
	if _, err := m.Save(4, fakeSave("s")); err != nil {
		t.Fatal(err)
	}
	inFlight := filepath.Join(dir, ".model.ckpt-5.tmp42")
	os.MkdirAll(inFlight, 0o755)
	prefix, step, ok, err := Latest(dir)
	if err != nil || !ok || step != 4 || prefix != filepath.Join(dir, "model.ckpt-4") {
		t.Fatalf("Latest = %q %d %v %v", prefix, step, ok, err)
	}
	if _, err := os.Stat(inFlight); err != nil {
		t.Fatalf("the save in flight was removed: %v", err)
	}
	if _, _, ok, err := Latest(t.TempDir()); ok || err != nil {
		t.Fatalf("empty directory: ok=%v err=%v", ok, err)
	}
}

// The state file stops naming a checkpoint before its files are deleted: a crash in the middle of
// the deletion leaves a state file whose checkpoints are all complete.
func TestStateFileIsRewrittenBeforeOldCheckpointsAreDeleted(t *testing.T) {
	dir := t.TempDir()
	m, _ := Open(dir, 1, 0)
	if _, err := m.Save(1, fakeSave("one")); err != nil {
		t.Fatal(err)
	}
	crash := errors.New("crash")
	var deleted []string
	m.remove = func(path string) error {
		state, _ := os.ReadFile(filepath.Join(dir, StateFile))
		if strings.Contains(string(state), "model.ckpt-1\"") {
			t.Errorf("deleting %s while the state file still names it:\n%s", filepath.Base(path), state)
		}
		deleted = append(deleted, filepath.Base(path))
		if err := os.Remove(path); err != nil {
			return err
		}
		if strings.HasSuffix(path, ".index") {
			return crash // the process dies right after the last file of the checkpoint is gone
		}
		return nil
	}
	if _, err := m.Save(2, fakeSave("two")); !errors.Is(err, crash) {
		t.Fatalf("Save with a failing deletion: err = %v", err)
	}
	if want := []string{"model.ckpt-1.data-00000-of-00001", "model.ckpt-1.index"}; !reflect.DeepEqual(deleted, want) {
		t.Fatalf("deleted %v, want %v", deleted, want)
	}
	// The restarted run resumes from the checkpoint saved before the crash.
	m2, err := Open(dir, 1, 0)
	if err != nil {
		t.Fatal(err)
	}
	prefix, step, ok, err := m2.Latest()
	if err != nil || !ok || step != 2 || prefix != filepath.Join(dir, "model.ckpt-2") {
		t.Fatalf("after the crash: Latest = %q %d %v %v", prefix, step, ok, err)
	}
}

// A state file whose latest checkpoint lost files falls back, with a warning, to the newest
// complete checkpoint it lists, and the next save of that step is written again.
func TestLatestFallsBackToNewestCompleteCheckpoint(t *testing.T) {
	dir := t.TempDir()
	m, _ := Open(dir, 3, 0)
	for _, step := range []int64{10, 20, 30} {
		if _, err := m.Save(step, fakeSave("s")); err != nil {
			t.Fatal(err)
		}
	}
	// 30 lost a data shard, 20 its index: 10 is the newest complete one.
	os.Remove(filepath.Join(dir, "model.ckpt-30.data-00000-of-00001"))
	os.Remove(filepath.Join(dir, "model.ckpt-20.index"))

	prefix, step, ok, err := Latest(dir)
	if err != nil || !ok || step != 10 || prefix != filepath.Join(dir, "model.ckpt-10") {
		t.Fatalf("Latest(dir) = %q %d %v %v", prefix, step, ok, err)
	}
	m2, err := Open(dir, 3, 0)
	if err != nil {
		t.Fatal(err)
	}
	var warnings []string
	m2.Warnf = func(format string, args ...any) { warnings = append(warnings, fmt.Sprintf(format, args...)) }
	prefix, step, ok, err = m2.Latest()
	if err != nil || !ok || step != 10 || prefix != filepath.Join(dir, "model.ckpt-10") {
		t.Fatalf("Manager.Latest = %q %d %v %v", prefix, step, ok, err)
	}
	if len(warnings) != 1 || !strings.Contains(warnings[0], "model.ckpt-30") ||
		!strings.Contains(warnings[0], "data-00000-of-") || !strings.Contains(warnings[0], "falling back to model.ckpt-10") {
		t.Fatalf("warnings %q", warnings)
	}
	// Training again reaches step 20 and 30: both are saved, not taken for the latest.
	for _, step := range []int64{20, 30} {
		if _, err := m2.Save(step, fakeSave("again")); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := os.Stat(filepath.Join(dir, "model.ckpt-30.data-00000-of-00001")); err != nil {
		t.Fatalf("step 30 was not saved again: %v", err)
	}
	if got, _, _, err := Latest(dir); err != nil || got != filepath.Join(dir, "model.ckpt-30") {
		t.Fatalf("after saving again: %q %v", got, err)
	}

	// Nothing complete left: an error naming the state file's checkpoint.
	for _, s := range []string{"10", "20", "30"} {
		os.Remove(filepath.Join(dir, "model.ckpt-"+s+".index"))
	}
	if _, _, _, err := Latest(dir); err == nil || !strings.Contains(err.Error(), "model.ckpt-30") ||
		!strings.Contains(err.Error(), "no other sound checkpoint: put the checkpoint's files back, or remove "+filepath.Join(dir, StateFile)+" to start from the beginning") {
		t.Fatalf("no complete checkpoint: err = %v", err)
	}
}

// A latest checkpoint whose files are all there but that Verify rejects (a truncated data file)
// is passed over like an incomplete one: the warning names each checkpoint passed over with
// Verify's reason, and no file of theirs is deleted.
func TestLatestPassesOverDamagedCheckpoints(t *testing.T) {
	dir := t.TempDir()
	m, _ := Open(dir, 5, 0)
	for _, step := range []int64{10, 20, 30} {
		if _, err := m.Save(step, fakeSave("s")); err != nil {
			t.Fatal(err)
		}
	}
	before, _ := filepath.Glob(filepath.Join(dir, "model.ckpt-*"))
	m2, err := Open(dir, 5, 0)
	if err != nil {
		t.Fatal(err)
	}
	var warnings []string
	m2.Warnf = func(format string, args ...any) { warnings = append(warnings, fmt.Sprintf(format, args...)) }
	m2.Verify = func(prefix string) error {
		if strings.HasSuffix(prefix, "-10") {
			return nil
		}
		return fmt.Errorf("%s.data-00000-of-00001 is damaged", prefix)
	}
	prefix, step, ok, err := m2.Latest()
	if err != nil || !ok || step != 10 || prefix != filepath.Join(dir, "model.ckpt-10") {
		t.Fatalf("Manager.Latest = %q %d %v %v", prefix, step, ok, err)
	}
	if len(warnings) != 1 || !strings.Contains(warnings[0], "model.ckpt-30.data-00000-of-00001 is damaged") ||
		!strings.Contains(warnings[0], "model.ckpt-20.data-00000-of-00001 is damaged") || !strings.Contains(warnings[0], "falling back to model.ckpt-10") {
		t.Fatalf("warnings %q", warnings)
	}
	after, _ := filepath.Glob(filepath.Join(dir, "model.ckpt-*"))
	if !slices.Equal(before, after) {
		t.Errorf("files before the fall back %v, after %v", before, after)
	}
	if got := m2.Kept(); !slices.Equal(got, []string{filepath.Join(dir, "model.ckpt-10")}) {
		t.Errorf("kept after the fall back: %v", got)
	}
}

// A file the SaveFunc writes beside the checkpoint (cmd/finetune's input position) is moved into
// place with it, before the state file names it, and deleted with it by retention.
func TestSidecarFilesTravelAndAreDeletedWithTheirCheckpoint(t *testing.T) {
	dir := t.TempDir()
	m, err := Open(dir, 1, 0)
	if err != nil {
		t.Fatal(err)
	}
	withSidecar := func(step int64) SaveFunc {
		return func(prefix string) error {
			if err := fakeSave("s")(prefix); err != nil {
				return err
			}
			return os.WriteFile(prefix+".sidecar.json", []byte(fmt.Sprint(step)), 0o644)
		}
	}
	if _, err := m.Save(1, withSidecar(1)); err != nil {
		t.Fatal(err)
	}
	if b, err := os.ReadFile(filepath.Join(dir, "model.ckpt-1.sidecar.json")); err != nil || string(b) != "1" {
		t.Fatalf("sidecar of step 1: %q %v", b, err)
	}
	// model.ckpt-1's glob must not reach model.ckpt-10's files.
	if _, err := m.Save(10, withSidecar(10)); err != nil {
		t.Fatal(err)
	}
	if _, err := m.Save(11, withSidecar(11)); err != nil {
		t.Fatal(err)
	}
	entries, _ := os.ReadDir(dir)
	var names []string
	for _, e := range entries {
		names = append(names, e.Name())
	}
	want := []string{StateFile, "model.ckpt-11.data-00000-of-00001", "model.ckpt-11.index", "model.ckpt-11.sidecar.json"}
	if !reflect.DeepEqual(names, want) {
		t.Fatalf("after retention the directory holds %v, want %v", names, want)
	}
}

// A save whose files cannot all be moved into place (here the index, after the data shard and
// a sidecar moved) removes the ones that did, leaves the state file and the previous checkpoint
// as they were, and does not stop the next save.
func TestFailedMoveLeavesNoPartialCheckpoint(t *testing.T) {
	dir := t.TempDir()
	m, err := Open(dir, 3, 0)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := m.Save(5, fakeSave("good")); err != nil {
		t.Fatal(err)
	}
	before, _ := os.ReadFile(filepath.Join(dir, StateFile))
	withSidecar := func(prefix string) error {
		if err := fakeSave("new")(prefix); err != nil {
			return err
		}
		return os.WriteFile(prefix+".input_position.json", []byte("{}"), 0o644)
	}
	boom := errors.New("EIO")
	var renamed []string
	m.rename = func(from, to string) error {
		if strings.HasSuffix(to, ".index") {
			return boom
		}
		renamed = append(renamed, filepath.Base(to))
		return os.Rename(from, to)
	}
	if _, err := m.Save(6, withSidecar); !errors.Is(err, boom) {
		t.Fatalf("err = %v, want the rename's", err)
	}
	if len(renamed) != 2 {
		t.Fatalf("the injected failure came after %v; want the data shard and the sidecar moved first", renamed)
	}
	if left, _ := filepath.Glob(filepath.Join(dir, "model.ckpt-6*")); left != nil {
		t.Errorf("the failed save left %v", left)
	}
	if after, _ := os.ReadFile(filepath.Join(dir, StateFile)); string(after) != string(before) {
		t.Errorf("state changed by a failed save:\n%s\n->\n%s", before, after)
	}
	if prefix, step, ok, err := m.Latest(); err != nil || !ok || step != 5 {
		t.Fatalf("Latest after the failed save = %q %d %v %v", prefix, step, ok, err)
	}
	m.rename = os.Rename
	if _, err := m.Save(6, withSidecar); err != nil {
		t.Fatal(err)
	}
	if got, want := listCheckpoints(t, dir), []string{"model.ckpt-5", "model.ckpt-6"}; !reflect.DeepEqual(got, want) {
		t.Fatalf("on disk %v, want %v", got, want)
	}
}

// A save killed while moving its files leaves files of a checkpoint without its index (the index
// moves last): Open removes them and nothing else.
func TestOpenRemovesCheckpointsWithoutIndex(t *testing.T) {
	dir := t.TempDir()
	m, _ := Open(dir, 3, 0)
	if _, err := m.Save(5, fakeSave("good")); err != nil {
		t.Fatal(err)
	}
	partial := []string{"model.ckpt-50.data-00000-of-00002", "model.ckpt-50.input_position.json"}
	for _, f := range partial {
		os.WriteFile(filepath.Join(dir, f), []byte("x"), 0o644)
	}
	other := filepath.Join(dir, "model.ckpt-best.data-00000-of-00001") // not ours to judge
	os.WriteFile(other, nil, 0o644)
	if _, err := Open(dir, 3, 0); err != nil {
		t.Fatal(err)
	}
	entries, _ := os.ReadDir(dir)
	var names []string
	for _, e := range entries {
		names = append(names, e.Name())
	}
	want := []string{StateFile, "model.ckpt-5.data-00000-of-00001", "model.ckpt-5.index", "model.ckpt-best.data-00000-of-00001"}
	if !reflect.DeepEqual(names, want) {
		t.Fatalf("after Open the directory holds %v, want %v", names, want)
	}
}
