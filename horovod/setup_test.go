package horovod

import (
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/gorovod/gorovod/horovod/backend"
	"github.com/gorovod/gorovod/horovod/local"
)

// closeRecorder is a backend that records its Close.
type closeRecorder struct {
	backend.Backend
	closed *atomic.Bool
}

func (c closeRecorder) Close() error { c.closed.Store(true); return c.Backend.Close() }

// setupJob inits size ranks over one loopback whose control backends record their Close; open,
// when non-nil, is each rank's data backend opener.
func setupJob(size int, timeline string, open func(rank int, control backend.Backend) (backend.Backend, error)) (*loopback, []*Horovod, []error, []atomic.Bool) {
	g := newLoopback(size)
	controlClosed := make([]atomic.Bool, size)
	hs, errs := initRanks(g, func(r int) []Option {
		opts := []Option{WithBackend(closeRecorder{loopRank{g, r}, &controlClosed[r]}), WithTimeline(timeline), WithCycleTime(time.Millisecond)}
		if open != nil {
			opts = append(opts, WithDataBackend(func(c backend.Backend) (backend.Backend, error) { return open(r, c) }))
		}
		return opts
	})
	return g, hs, errs, controlClosed
}

// checkNothingRuns checks that after a failed Init no rank has a background loop contributing to
// a collective (one would within a few cycles of 1ms) and that every control backend is closed.
func checkNothingRuns(t *testing.T, g *loopback, controlClosed []atomic.Bool) {
	t.Helper()
	time.Sleep(50 * time.Millisecond)
	g.mu.Lock()
	arrived := g.arrived
	g.mu.Unlock()
	if arrived != 0 {
		t.Errorf("%d ranks entered a collective after Init failed", arrived)
	}
	for r := range controlClosed {
		if !controlClosed[r].Load() {
			t.Errorf("rank %d: control backend left open", r)
		}
	}
}

// The reviewer's hang: HOROVOD_TIMELINE is opened by rank 0 only, so a bad path failed rank 0
// alone, which finalized while the others waited for it in their first negotiation.
func TestTimelineFailingOnRankZeroFailsEveryRank(t *testing.T) {
	path := filepath.Join(t.TempDir(), "missing", "timeline.json")
	g, hs, errs, controlClosed := setupJob(3, path, nil)
	cause := fmt.Sprintf("HOROVOD_TIMELINE: open %s: no such file or directory", path)
	for r, err := range errs {
		if hs[r] != nil {
			t.Fatalf("rank %d: Init succeeded", r)
		}
		want := fmt.Sprintf("horovod: rank %d: Init failed on ranks [0]: rank 0: %s", r, cause)
		if err == nil || err.Error() != want {
			t.Errorf("rank %d: got %v\nwant %s", r, err, want)
		}
		var se *SetupError
		if !errors.As(err, &se) || se.Rank != r || !slices.Equal(se.Failed, []int{0}) {
			t.Errorf("rank %d: %#v", r, err)
		}
		// Only rank 0's error is its own: the others were ready.
		if errors.Is(err, fs.ErrNotExist) != (r == 0) {
			t.Errorf("rank %d: errors.Is(err, fs.ErrNotExist) = %v", r, errors.Is(err, fs.ErrNotExist))
		}
	}
	checkNothingRuns(t, g, controlClosed)
}

// A data backend that fails on some ranks after its own collectives: every rank fails, the ready
// ranks close the data backend they opened, and rank 0 closes the timeline it created.
func TestDataBackendFailingOnSomeRanksFailsEveryRank(t *testing.T) {
	path := filepath.Join(t.TempDir(), "timeline.json")
	dataClosed := make([]atomic.Bool, 4)
	noGPU := errors.New("no GPU for this rank")
	g, hs, errs, controlClosed := setupJob(4, path, func(r int, control backend.Backend) (backend.Backend, error) {
		if err := control.Barrier(); err != nil { // the opener's own agreement: every rank makes it
			return nil, err
		}
		if r == 1 || r == 3 {
			return nil, fmt.Errorf("rank %d: %w", r, noGPU)
		}
		return closeRecorder{local.Backend{}, &dataClosed[r]}, nil
	})
	for r, err := range errs {
		if hs[r] != nil {
			t.Fatalf("rank %d: Init succeeded", r)
		}
		want := fmt.Sprintf("horovod: rank %d: Init failed on ranks [1 3]: "+
			"rank 1: opening the data backend: rank 1: no GPU for this rank; "+
			"rank 3: opening the data backend: rank 3: no GPU for this rank", r)
		if err == nil || err.Error() != want {
			t.Errorf("rank %d: got %v\nwant %s", r, err, want)
		}
		failed := r == 1 || r == 3
		if errors.Is(err, noGPU) != failed {
			t.Errorf("rank %d: errors.Is(err, noGPU) = %v", r, errors.Is(err, noGPU))
		}
		if !failed && !dataClosed[r].Load() {
			t.Errorf("rank %d: the data backend it opened was left open", r)
		}
	}
	checkNothingRuns(t, g, controlClosed)
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var events []any
	if err := json.Unmarshal(b, &events); err != nil || len(events) != 0 {
		t.Errorf("rank 0's timeline was not closed as an empty trace: %v %q", err, b)
	}
}

// brokenControl is a job of one rank whose collectives fail.
type brokenControl struct{ local.Backend }

func (brokenControl) Allgatherv(send, recv []byte, counts []int) error {
	return errors.New("link down")
}

// When the agreement itself fails, the error says so and keeps this rank's own cause.
func TestSetupAgreementFailureKeepsTheLocalCause(t *testing.T) {
	path := filepath.Join(t.TempDir(), "missing", "timeline.json")
	_, err := Init(WithBackend(brokenControl{}), WithTimeline(path))
	want := fmt.Sprintf("horovod: rank 0: agreeing on Init with the other ranks (error lengths and settings): link down\n"+
		"HOROVOD_TIMELINE: open %s: no such file or directory", path)
	if err == nil || err.Error() != want || !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("got %v\nwant %s", err, want)
	}
}

// Ranks started with other fusion thresholds and cache capacities than rank 0 (an environment set
// per machine) take rank 0's and say so: with its own threshold, rank 1 alone would allreduce the
// group's two tensors one by one while rank 0 fuses them, and the sums would be wrong.
func TestRanksTakeRankZerosFusionAndCacheSettings(t *testing.T) {
	g := newLoopback(3)
	logs := make([]syncBuffer, 3)
	hs, errs := initRanks(g, func(r int) []Option {
		threshold, capacity := 1<<20, 16
		if r == 1 {
			threshold, capacity = 0, 0
		}
		return []Option{WithLogOutput(&logs[r]), WithFusionThreshold(threshold), func(c *config) { c.CacheCapacity = capacity }}
	})
	if err := errors.Join(errs...); err != nil {
		t.Fatal(err)
	}
	defer func() {
		for _, h := range hs {
			h.Shutdown()
		}
	}()
	for r, h := range hs {
		if h.cfg.FusionThreshold != 1<<20 || h.cfg.CacheCapacity != 16 || h.ctl.cache.capacity != 16 {
			t.Errorf("rank %d: fusion threshold %d, cache capacity %d (cache %d); want rank 0's 1048576 and 16",
				r, h.cfg.FusionThreshold, h.cfg.CacheCapacity, h.ctl.cache.capacity)
		}
	}
	for range 3 { // the later rounds announce the group by cache slot
		onEveryRank(t, hs, func(h *Horovod) error {
			r := float32(h.Rank())
			out, err := h.GroupedAllreduce([]NamedTensor{
				{Name: "a", Tensor: mustTensor(t, []int{2}, []float32{r, 1})},
				{Name: "b", Tensor: mustTensor(t, []int{3}, []float32{10 * r, 10, 100})},
			}, AllreduceOptions{Op: Sum})
			if err != nil {
				return err
			}
			if a, b := mustValues[float32](out[0]), mustValues[float32](out[1]); !slices.Equal(a, []float32{3, 3}) || !slices.Equal(b, []float32{30, 30, 300}) {
				return fmt.Errorf("sums a %v, b %v; want [3 3], [30 30 300]", a, b)
			}
			return nil
		})
	}
	for r := range logs {
		said := logs[r].String()
		for _, want := range []string{
			"HOROVOD_FUSION_THRESHOLD is 0 on this rank, 1048576 on rank 0: using rank 0's",
			"HOROVOD_CACHE_CAPACITY is 0 on this rank, 16 on rank 0: using rank 0's",
		} {
			if strings.Contains(said, want) != (r == 1) {
				t.Errorf("rank %d's log %q; saying %q: %v", r, said, want, r == 1)
			}
		}
	}
}

// Ranks started with other stall times than rank 0's take rank 0's as Init settled them, and say
// so: with its own 50ms shutdown time, rank 1 alone would abort the job while rank 0 waits for a
// late operation. Rank 2's shutdown time, shorter than its check time, is off as rank 0's is: it
// has nothing to take.
func TestRanksTakeRankZerosStallSettings(t *testing.T) {
	g := newLoopback(3)
	logs := make([]syncBuffer, 3)
	stall := [][2]time.Duration{{time.Minute, 0}, {0, 50 * time.Millisecond}, {time.Minute, time.Second}}
	hs, errs := initRanks(g, func(r int) []Option {
		return []Option{WithLogOutput(&logs[r]), WithStallCheck(stall[r][0], stall[r][1])}
	})
	if err := errors.Join(errs...); err != nil {
		t.Fatal(err)
	}
	for r, h := range hs {
		if h.cfg.StallCheck != time.Minute || h.cfg.StallShutdown != 0 {
			t.Errorf("rank %d: stall check %v, shutdown %v; want rank 0's 1m0s and 0s", r, h.cfg.StallCheck, h.cfg.StallShutdown)
		}
	}
	x := mustTensor(t, nil, []float32{1})
	late, err := hs[0].AllreduceAsync("late", x, AllreduceOptions{})
	if err != nil {
		t.Fatal(err)
	}
	select {
	case r := <-g.aborted: // the ranks are abandoned: an aborted job has nothing to shut down
		t.Fatalf("rank %d aborted the job; rank 0 has no stall shutdown time. Its log:\n%s", r, logs[r].String())
	case <-time.After(300 * time.Millisecond):
	}
	onEveryRank(t, hs[1:], func(h *Horovod) error {
		_, err := h.Allreduce("late", x, AllreduceOptions{})
		return err
	})
	if _, err := late.Wait(); err != nil {
		t.Fatal(err)
	}
	for _, h := range hs {
		h.Shutdown()
	}
	for r := range logs {
		said := logs[r].String()
		for _, want := range []string{
			"HOROVOD_STALL_CHECK_TIME_SECONDS is 0s on this rank, 1m0s on rank 0: using rank 0's",
			"HOROVOD_STALL_SHUTDOWN_TIME_SECONDS is 50ms on this rank, 0s on rank 0: using rank 0's",
		} {
			if strings.Contains(said, want) != (r == 1) {
				t.Errorf("rank %d's log %q; saying %q: %v", r, said, want, r == 1)
			}
		}
	}
}
