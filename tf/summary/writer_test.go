package summary

import (
	"encoding/json"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/gorovod/gorovod/tf/testenv"
)

// TensorFlow's own reader must see the file version, then every step with its tags and values.
func TestSummaryIteratorReadsOurEvents(t *testing.T) {
	dir := t.TempDir()
	clock := time.Unix(1_700_000_000, 250_000_000)
	w, err := create(dir, func() time.Time { return clock })
	if err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(filepath.Base(w.Path()), "events.out.tfevents.1700000000.") {
		t.Fatalf("file name %s", w.Path())
	}
	for step := int64(1); step <= 3; step++ {
		clock = clock.Add(time.Second)
		if err := w.Scalars(step, map[string]float64{"loss": 1 / float64(step), "learning_rate": 1e-5 * float64(step),
			"global_norm": math.Sqrt(float64(step)), "examples_per_sec": 100}); err != nil {
			t.Fatal(err)
		}
	}
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	out := testenv.Python(t, `
import json, sys
import tensorflow as tf
events = []
for e in tf.compat.v1.train.summary_iterator(sys.argv[1]):
    events.append({"wall_time": e.wall_time, "step": e.step, "file_version": e.file_version,
                   "values": {v.tag: v.simple_value for v in e.summary.value}})
print(json.dumps(events))
`, w.Path())
	var got []struct {
		WallTime    float64 `json:"wall_time"`
		Step        int64
		FileVersion string `json:"file_version"`
		Values      map[string]float64
	}
	if err := json.Unmarshal(out, &got); err != nil {
		t.Fatalf("%v: %s", err, out)
	}
	if len(got) != 4 || got[0].FileVersion != "brain.Event:2" || math.Abs(got[0].WallTime-1_700_000_000.25) > 1e-6 {
		t.Fatalf("events %+v", got)
	}
	for i, e := range got[1:] {
		step := int64(i + 1)
		want := map[string]float64{"loss": 1 / float64(step), "learning_rate": 1e-5 * float64(step),
			"global_norm": math.Sqrt(float64(step)), "examples_per_sec": 100}
		if e.Step != step || math.Abs(e.WallTime-1_700_000_000.25-float64(step)) > 1e-6 || len(e.Values) != len(want) {
			t.Fatalf("event %d: %+v", step, e)
		}
		for tag, v := range want {
			if float32(e.Values[tag]) != float32(v) { // simple_value is a float32
				t.Errorf("step %d %s = %v, want %v", step, tag, e.Values[tag], v)
			}
		}
	}
}

// Close reports a failure of the file underneath, naming it, and only its first call does.
func TestCloseReportsTheFileError(t *testing.T) {
	w, err := Create(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	if err := w.Scalars(1, map[string]float64{"loss": 1}); err != nil {
		t.Fatal(err)
	}
	w.f.Close() // the descriptor fails under the writer: its sync and close must say so
	if err := w.Close(); err == nil || !strings.Contains(err.Error(), w.Path()) {
		t.Fatalf("Close over a failed file = %v, want an error naming %s", err, w.Path())
	}
	if err := w.Close(); err != nil {
		t.Fatalf("second Close = %v, want nil", err)
	}
	ok, err := Create(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	if err := ok.Close(); err != nil {
		t.Fatal(err)
	}
}

// Two writers started in the same second in one directory (two runs, or a restart) each get a
// file of their own, where one shared name would interleave their records.
func TestWritersOfOneSecondGetFilesOfTheirOwn(t *testing.T) {
	dir := t.TempDir()
	clock := func() time.Time { return time.Unix(1_700_000_000, 0) }
	var paths []string
	for range 2 {
		w, err := create(dir, clock)
		if err != nil {
			t.Fatal(err)
		}
		if err := w.Scalars(1, map[string]float64{"loss": 1}); err != nil {
			t.Fatal(err)
		}
		if err := w.Close(); err != nil {
			t.Fatal(err)
		}
		paths = append(paths, w.Path())
	}
	entries, _ := os.ReadDir(dir)
	if paths[0] == paths[1] || len(entries) != 2 {
		t.Fatalf("two writers wrote %q, %d files", paths, len(entries))
	}
	wantPrefix := fmt.Sprintf("events.out.tfevents.1700000000.%s.%d.", hostname(t), os.Getpid())
	for _, p := range paths {
		if !strings.HasPrefix(filepath.Base(p), wantPrefix) {
			t.Errorf("file name %s, want %s<n>", filepath.Base(p), wantPrefix)
		}
	}
}

func hostname(t *testing.T) string {
	h, err := os.Hostname()
	if err != nil {
		t.Fatal(err)
	}
	return h
}

// A run resumed from step 4 of a run killed after step 5 marks its start: TensorBoard's own
// reader (the EventAccumulator its server uses) then shows one point a step, the resumed run's
// from step 4 on, instead of steps 4 and 5 twice.
func TestSessionStartDropsAKilledRunsLaterSteps(t *testing.T) {
	dir := t.TempDir()
	write := func(first, last int64, loss float64, start bool) {
		w, err := Create(dir)
		if err != nil {
			t.Fatal(err)
		}
		if start {
			if err := w.SessionStart(first); err != nil {
				t.Fatal(err)
			}
		}
		for step := first; step <= last; step++ {
			if err := w.Scalars(step, map[string]float64{"loss": loss}); err != nil {
				t.Fatal(err)
			}
		}
		if err := w.Close(); err != nil {
			t.Fatal(err)
		}
	}
	write(1, 5, 1, true) // killed after step 5, its checkpoint of step 3 kept
	write(4, 6, 2, true) // resumed from step 3
	out := testenv.Python(t, `
import json, sys
from tensorboard.backend.event_processing import plugin_event_accumulator as pea
acc = pea.EventAccumulator(sys.argv[1])
acc.Reload()
print(json.dumps([[e.step, float(__import__("tensorflow").make_ndarray(e.tensor_proto))] for e in acc.Tensors("loss")]))
`, dir)
	var got [][2]float64
	if err := json.Unmarshal(out, &got); err != nil {
		t.Fatalf("%v: %s", err, out)
	}
	want := [][2]float64{{1, 1}, {2, 1}, {3, 1}, {4, 2}, {5, 2}, {6, 2}}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Errorf("TensorBoard's points (step, loss): %v, want %v", got, want)
	}
}
