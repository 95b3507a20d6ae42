package horovod

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"
)

// readTimelineFile reads a complete timeline file: a JSON array of events.
func readTimelineFile(t *testing.T, path string) []timelineEvent {
	t.Helper()
	raw, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var events []timelineEvent
	if err := json.Unmarshal(raw, &events); err != nil {
		t.Fatalf("%s is not a JSON array of events: %v\n%s", path, err, raw)
	}
	return events
}

// rowsOf is the names of a timeline's rows, sorted.
func rowsOf(phases map[string][]string) []string {
	var rows []string
	for row := range phases {
		rows = append(rows, row)
	}
	slices.Sort(rows)
	return rows
}

// StartTimeline and StopTimeline record the operations between them, the job's and a process
// set's, on rank 0 alone; StartTimeline while one records completes that file and begins its
// own, and Shutdown completes the last.
func TestStartAndStopTimeline(t *testing.T) {
	dir := t.TempDir()
	hs, _ := job(t, 3, WithDynamicProcessSets())
	sets := addSets(t, hs, []int{0, 2})
	pathOf := func(h *Horovod, name string) string {
		return filepath.Join(dir, fmt.Sprintf("%s.rank%d.json", name, h.Rank()))
	}
	allreduce := func(name string) func(h *Horovod) error {
		return func(h *Horovod) error {
			x := mustTensor(t, nil, []float32{1})
			if _, err := h.Allreduce(name, x, AllreduceOptions{}); err != nil {
				return err
			}
			if set := sets[h.Rank()][0]; set != nil {
				_, err := set.Allreduce(name, x, AllreduceOptions{})
				return err
			}
			return nil
		}
	}
	onEveryRank(t, hs, allreduce("before"))
	onEveryRank(t, hs, func(h *Horovod) error { return h.StopTimeline() }) // none started: nothing to do
	onEveryRank(t, hs, func(h *Horovod) error { return h.StartTimeline(pathOf(h, "first")) })
	onEveryRank(t, hs, allreduce("during"))
	onEveryRank(t, hs, func(h *Horovod) error { return h.StopTimeline() })
	onEveryRank(t, hs, func(h *Horovod) error { return h.StopTimeline() }) // stopped already
	onEveryRank(t, hs, allreduce("after"))
	onEveryRank(t, hs, func(h *Horovod) error { return h.StartTimeline(pathOf(h, "second")) })
	onEveryRank(t, hs, allreduce("last"))
	onEveryRank(t, hs, func(h *Horovod) error { return h.StartTimeline(pathOf(h, "third")) }) // completes the second
	onEveryRank(t, hs, allreduce("final"))
	for _, h := range hs {
		if err := h.Shutdown(); err != nil {
			t.Fatal(err)
		}
	}

	want := []string{"NEGOTIATE_ALLREDUCE", "ALLREDUCE", "QUEUE", "LOOPBACK_ALLREDUCE"}
	for file, name := range map[string]string{"first": "during", "second": "last", "third": "final"} {
		phases, _ := timelineRows(t, readTimelineFile(t, pathOf(hs[0], file)))
		wantRows := []string{name, "process set [0 2]: " + name}
		if rows := rowsOf(phases); !slices.Equal(rows, wantRows) {
			t.Errorf("%s timeline: rows %v, want %v", file, rows, wantRows)
		}
		for _, row := range wantRows {
			if !slices.Equal(phases[row], want) {
				t.Errorf("%s timeline, row %q: phases %v, want %v", file, row, phases[row], want)
			}
		}
		for _, h := range hs[1:] {
			if _, err := os.Stat(pathOf(h, file)); !errors.Is(err, os.ErrNotExist) {
				t.Errorf("rank %d created a timeline file (%v): only rank 0 writes one", h.Rank(), err)
			}
		}
	}
	onEveryRank(t, hs, func(h *Horovod) error {
		if err := h.StartTimeline(pathOf(h, "shut")); !errors.Is(err, ErrShutdown) {
			return fmt.Errorf("StartTimeline after Shutdown: %v, want ErrShutdown", err)
		}
		return nil
	})
}

// StartTimeline refuses an empty path and a process set, and fails on rank 0 alone, naming the
// path, when rank 0 cannot create the file; the job goes on without a timeline.
func TestStartTimelineErrors(t *testing.T) {
	hs, _ := job(t, 2, WithDynamicProcessSets())
	sets := addSets(t, hs, []int{0, 1})
	missing := filepath.Join(t.TempDir(), "missing", "timeline.json")
	onEveryRank(t, hs, func(h *Horovod) error {
		if err := h.StartTimeline(""); err == nil || !strings.Contains(err.Error(), "empty") {
			return fmt.Errorf("StartTimeline of an empty path: %v", err)
		}
		if err := sets[h.Rank()][0].StartTimeline(missing); err == nil || !strings.Contains(err.Error(), "process set [0 1]") {
			return fmt.Errorf("StartTimeline on a process set: %v", err)
		}
		if err := sets[h.Rank()][0].StopTimeline(); err == nil || !strings.Contains(err.Error(), "process set [0 1]") {
			return fmt.Errorf("StopTimeline on a process set: %v", err)
		}
		err := h.StartTimeline(missing)
		switch {
		case h.Rank() == 0 && (err == nil || !strings.Contains(err.Error(), missing)):
			return fmt.Errorf("rank 0: StartTimeline into a missing directory: %v, want an error naming %s", err, missing)
		case h.Rank() != 0 && err != nil:
			return fmt.Errorf("rank %d: StartTimeline: %v (only rank 0 creates the file)", h.Rank(), err)
		}
		_, err = h.Allreduce("after", mustTensor(t, nil, []float32{1}), AllreduceOptions{})
		return err
	})
}

// A timeline started while phases are under way leaves their ends out and begins with their next
// phases; stopping it ends the phases still open, so that every file nests its phases.
func TestTimelineStartedAndStoppedMidPhase(t *testing.T) {
	path := filepath.Join(t.TempDir(), "timeline.json")
	tl := newTimeline()
	before := time.Now()
	tl.begin("a", "NEGOTIATE_ALLREDUCE", before) // not recording: left out
	if err := tl.startFile(path); err != nil {
		t.Fatal(err)
	}
	tl.finish("a", time.Now()) // the end of a phase the file does not have
	tl.begin("a", "ALLREDUCE", before)
	tl.begin("b", "QUEUE", time.Now())
	tl.finish("b", time.Now())
	tl.begin("b", "MPI_ALLREDUCE", time.Now())
	if err := tl.close(); err != nil {
		t.Fatal(err)
	}
	events := readTimelineFile(t, path)
	phases, _ := timelineRows(t, events) // fails on an end without a begin, or a phase left open
	for row, want := range map[string][]string{"a": {"ALLREDUCE"}, "b": {"QUEUE", "MPI_ALLREDUCE"}} {
		if !slices.Equal(phases[row], want) {
			t.Errorf("row %s: phases %v, want %v", row, phases[row], want)
		}
	}
	for _, e := range events {
		if e.TS < 0 {
			t.Errorf("event %+v before the timeline began", e)
		}
	}
	if err := tl.startFile(path); !errors.Is(err, ErrShutdown) {
		t.Errorf("startFile after close: %v, want ErrShutdown", err)
	}
}
