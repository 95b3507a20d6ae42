package horovod

import (
	"errors"
	"fmt"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/gorovod/gorovod/horovod/backend"
	"github.com/gorovod/gorovod/horovod/local"
)

// addSets adds the process sets of members, in order, on every rank of hs, and returns each
// rank's sets (nil where a rank is not a member).
func addSets(t *testing.T, hs []*Horovod, members ...[]int) [][]*Horovod {
	t.Helper()
	sets := make([][]*Horovod, len(hs))
	onEveryRank(t, hs, func(h *Horovod) error {
		for _, m := range members {
			set, err := h.AddProcessSet(m)
			if err != nil {
				return err
			}
			if got := set != nil; got != slices.Contains(m, h.Rank()) {
				return fmt.Errorf("process set %v: a set on rank %d is %v", m, h.Rank(), got)
			}
			sets[h.Rank()] = append(sets[h.Rank()], set)
		}
		return nil
	})
	if t.Failed() {
		t.FailNow()
	}
	return sets
}

// A process set's collectives run among its members alone, with ranks numbered within the
// set, while the job's collectives (under the same names) and another set's go on at the same
// time.
func TestProcessSetCollectives(t *testing.T) {
	hs, _ := job(t, 3, WithDynamicProcessSets())
	sets := addSets(t, hs, []int{0, 2}, []int{1, 2})
	onEveryRank(t, hs, func(h *Horovod) error {
		rank := h.Rank()
		var wg sync.WaitGroup
		errs := make([]error, 3)
		wg.Go(func() { errs[0] = checkSetCollectives(h, h, []int{0, 1, 2}) })
		for i, m := range [][]int{{0, 2}, {1, 2}} {
			if set := sets[rank][i]; set != nil {
				wg.Go(func() { errs[i+1] = checkSetCollectives(h, set, m) })
			}
		}
		wg.Wait()
		return errors.Join(errs...)
	})
}

// checkSetCollectives runs every kind of collective on set (the job itself, or one of its
// process sets, whose job ranks are members) from job rank h.Rank() and checks the results
// against what the members, and only they, contributed.
func checkSetCollectives(h, set *Horovod, members []int) error {
	rank := h.Rank()
	if set.Size() != len(members) || members[set.Rank()] != rank {
		return fmt.Errorf("set %v on job rank %d: rank %d of %d", members, rank, set.Rank(), set.Size())
	}
	if got := set.ProcessSetRanks(); set != h && !slices.Equal(got, members) {
		return fmt.Errorf("set %v: ProcessSetRanks %v", members, got)
	}
	where := fmt.Sprintf("set %v, job rank %d", members, rank)
	sum := 0.0
	for _, m := range members {
		sum += float64(m + 1)
	}
	for step := range 5 {
		x, _ := NewTensor([]int{2}, []float64{float64(rank + 1), float64(step)})
		got, err := set.Allreduce("x", x, AllreduceOptions{Op: Sum})
		if err != nil {
			return fmt.Errorf("%s: allreduce: %w", where, err)
		}
		if v := mustValues[float64](got); v[0] != sum || v[1] != float64(step*len(members)) {
			return fmt.Errorf("%s: allreduce step %d = %v, want [%v %v]", where, step, v, sum, step*len(members))
		}
	}
	root := set.Size() - 1 // the set's last rank: job rank members[root]
	b, _ := NewTensor([]int{1}, []int32{int32(rank)})
	got, err := set.Broadcast("b", b, root)
	if err != nil {
		return fmt.Errorf("%s: broadcast: %w", where, err)
	}
	if v := mustValues[int32](got); v[0] != int32(members[root]) {
		return fmt.Errorf("%s: broadcast from set rank %d = %v, want job rank %d's", where, root, v, members[root])
	}
	rows := make([]int32, rank+1) // job rank r gives r+1 rows of r
	for i := range rows {
		rows[i] = int32(rank)
	}
	g, _ := NewTensor([]int{rank + 1}, rows)
	got, err = set.Allgather("g", g)
	if err != nil {
		return fmt.Errorf("%s: allgather: %w", where, err)
	}
	var want []int32
	for _, m := range members {
		for range m + 1 {
			want = append(want, int32(m))
		}
	}
	if v := mustValues[int32](got); !slices.Equal(v, want) {
		return fmt.Errorf("%s: allgather = %v, want %v", where, v, want)
	}
	// Reducescatter: one row per member, row i holding i+1 on every rank; this rank's block is
	// its row of the sum.
	in := make([]float32, len(members))
	for i := range in {
		in[i] = float32(i + 1)
	}
	rs, _ := NewTensor([]int{len(members)}, in)
	got, err = set.Reducescatter("rs", rs, ReducescatterOptions{Op: Sum})
	if err != nil {
		return fmt.Errorf("%s: reducescatter: %w", where, err)
	}
	if v := mustValues[float32](got); len(v) != 1 || v[0] != float32((set.Rank()+1)*len(members)) {
		return fmt.Errorf("%s: reducescatter = %v, want [%d]", where, v, (set.Rank()+1)*len(members))
	}
	// Alltoall: a row to every member, holding this job rank.
	out := make([]int64, len(members))
	for i := range out {
		out[i] = int64(rank)
	}
	a, _ := NewTensor([]int{len(members)}, out)
	got, recv, err := set.Alltoall("a", a, slices.Repeat([]int{1}, len(members)))
	if err != nil {
		return fmt.Errorf("%s: alltoall: %w", where, err)
	}
	wantA := make([]int64, len(members))
	for i, m := range members {
		wantA[i] = int64(m)
	}
	if v := mustValues[int64](got); !slices.Equal(v, wantA) || !slices.Equal(recv, slices.Repeat([]int{1}, len(members))) {
		return fmt.Errorf("%s: alltoall = %v (rows %v), want %v", where, v, recv, wantA)
	}
	if err := set.Barrier(); err != nil {
		return fmt.Errorf("%s: barrier: %w", where, err)
	}
	return nil
}

// A set's Shutdown ends it on its members (Horovod's remove_process_set); the job goes on, and
// the job's Shutdown ends the sets still open first.
func TestProcessSetShutdown(t *testing.T) {
	hs, _ := job(t, 3, WithDynamicProcessSets())
	sets := addSets(t, hs, []int{0, 1}, []int{1, 2})
	x := mustTensor(t, []int{1}, []float32{1})
	onEveryRank(t, hs, func(h *Horovod) error {
		if first := sets[h.Rank()][0]; first != nil {
			if err := first.Shutdown(); err != nil {
				return err
			}
			if _, err := first.Allreduce("x", x, AllreduceOptions{}); !errors.Is(err, ErrShutdown) {
				return fmt.Errorf("allreduce on a set shut down: %v, want ErrShutdown", err)
			}
		}
		if _, err := h.Allreduce("x", x, AllreduceOptions{}); err != nil {
			return fmt.Errorf("the job after a set's shutdown: %w", err)
		}
		if err := h.Shutdown(); err != nil {
			return err
		}
		if second := sets[h.Rank()][1]; second != nil {
			if _, err := second.Allreduce("x", x, AllreduceOptions{}); !errors.Is(err, ErrShutdown) {
				return fmt.Errorf("allreduce on a set after the job's shutdown: %v, want ErrShutdown", err)
			}
		}
		return nil
	})
}

// Misuse fails AddProcessSet with the same error on every rank, and nothing hangs: ranks that
// differ are caught by negotiation, a job without the setting (on any rank) and bad ranks
// before it.
func TestProcessSetErrors(t *testing.T) {
	everyRankFails := func(t *testing.T, hs []*Horovod, members func(rank int) []int, want string) {
		t.Helper()
		errs := make([]error, len(hs))
		var wg sync.WaitGroup
		for r, h := range hs {
			wg.Go(func() {
				var set *Horovod
				set, errs[r] = h.AddProcessSet(members(r))
				if set != nil {
					errs[r] = fmt.Errorf("got a set, and error %v", errs[r])
				}
			})
		}
		wg.Wait()
		for r, err := range errs {
			if err == nil || !strings.Contains(err.Error(), want) {
				t.Errorf("rank %d: %v, want an error containing %q", r, err, want)
			}
		}
	}
	t.Run("off", func(t *testing.T) {
		hs, _ := job(t, 2)
		everyRankFails(t, hs, func(int) []int { return []int{0} }, "process sets need HOROVOD_DYNAMIC_PROCESS_SETS=1")
	})
	t.Run("off on one rank", func(t *testing.T) {
		g := newLoopback(2)
		hs, errs := initRanks(g, func(r int) []Option {
			if r == 0 {
				return []Option{WithDynamicProcessSets()}
			}
			return nil
		})
		if err := errors.Join(errs...); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() {
			for _, h := range hs {
				h.Shutdown()
			}
		})
		everyRankFails(t, hs, func(int) []int { return []int{0} }, "process sets need HOROVOD_DYNAMIC_PROCESS_SETS=1")
	})
	t.Run("data backend", func(t *testing.T) {
		// A data backend of its own (NCCL's adapter) has no Split: process sets run over the job's.
		hs, _ := job(t, 2, WithDynamicProcessSets(), WithDataBackend(func(control backend.Backend) (backend.Backend, error) {
			return struct{ backend.Backend }{control}, nil
		}))
		everyRankFails(t, hs, func(int) []int { return []int{0} }, "AddProcessSet: the loopback backend has no process sets")
	})
	t.Run("backend cannot split", func(t *testing.T) {
		// The setting on, but the backend opened without it (WithBackend): every rank's Split
		// refuses before any collective, AddProcessSet fails alike, and the job goes on.
		hs, g := job(t, 2, WithDynamicProcessSets())
		g.cannotSplit.Store(true)
		everyRankFails(t, hs, func(int) []int { return []int{0} }, `horovod: process set "horovod.process_set": loopback: cannot split into process sets`)
		g.cannotSplit.Store(false)
		sets := addSets(t, hs, []int{0, 1})
		onEveryRank(t, hs, func(h *Horovod) error { return checkSetCollectives(h, sets[h.Rank()][0], []int{0, 1}) })
	})
	hs, _ := job(t, 3, WithDynamicProcessSets())
	for _, tc := range []struct {
		members []int
		want    string
	}{
		{nil, "a process set needs at least one rank"},
		{[]int{2, 0}, "ranks [2 0] are not in ascending order without repeats"},
		{[]int{0, 0}, "ranks [0 0] are not in ascending order without repeats"},
		{[]int{1, 3}, "ranks [1 3]: 3 is not a rank of a job of 3"},
		{[]int{-1}, "ranks [-1]: -1 is not a rank of a job of 3"},
	} {
		everyRankFails(t, hs, func(int) []int { return tc.members }, tc.want)
	}
	everyRankFails(t, hs, func(r int) []int { return []int{0, max(r, 1)} },
		`horovod: process set "horovod.process_set": mismatched process set ranks: [0 1] on ranks 0,1; [0 2] on rank 2`)
	// The job goes on: a set added after the failures works, and adds no set of its own.
	sets := addSets(t, hs, []int{0, 1, 2})
	onEveryRank(t, hs, func(h *Horovod) error {
		set := sets[h.Rank()][0]
		if _, err := set.AddProcessSet([]int{0}); err == nil || !strings.Contains(err.Error(), "a process set adds no sets of its own") {
			return fmt.Errorf("a set's AddProcessSet: %v", err)
		}
		return checkSetCollectives(h, set, []int{0, 1, 2})
	})
}

// A rank that has joined adds no process set: the others' AddProcessSet fails, naming it.
func TestProcessSetWithAJoinedRank(t *testing.T) {
	hs, _ := job(t, 2, WithDynamicProcessSets())
	var wg sync.WaitGroup
	var joinErr error
	wg.Go(func() { _, joinErr = hs[1].Join() })
	_, addErr := hs[0].AddProcessSet([]int{0, 1})
	if want := "every rank adds a process set, and rank(s) 1 have joined"; addErr == nil || !strings.Contains(addErr.Error(), want) {
		t.Errorf("rank 0's AddProcessSet: %v, want an error containing %q", addErr, want)
	}
	if _, err := hs[0].Join(); err != nil {
		t.Errorf("rank 0's Join: %v", err)
	}
	wg.Wait()
	if joinErr != nil {
		t.Errorf("rank 1's Join: %v", joinErr)
	}
}

// A job of one process (the local backend) has process sets too: the set of rank 0.
func TestProcessSetOfALocalJob(t *testing.T) {
	h, err := Init(WithBackend(local.Backend{}), WithDynamicProcessSets())
	if err != nil {
		t.Fatal(err)
	}
	defer h.Shutdown()
	set, err := h.AddProcessSet([]int{0})
	if err != nil || set == nil {
		t.Fatalf("AddProcessSet([0]): %v, %v", set, err)
	}
	if err := checkSetCollectives(h, set, []int{0}); err != nil {
		t.Error(err)
	}
}

// A set is a job of its own to its members: a Reducer averages over the set (its ranks
// renumbered from 0), and Join waits for the set's members alone.
func TestProcessSetReducerAndJoin(t *testing.T) {
	hs, _ := job(t, 3, WithDynamicProcessSets())
	sets := addSets(t, hs, []int{1, 2})
	onEveryRank(t, hs[1:], func(h *Horovod) error {
		set := sets[h.Rank()][0]
		if err := checkDeferredAverage(t, set, ReducerOptions{BackwardPassesPerStep: 2}); err != nil {
			return err
		}
		last, err := set.Join()
		if err != nil || last < 0 || last > 1 {
			return fmt.Errorf("the set's Join: %d, %v; want a rank of the set", last, err)
		}
		return nil
	})
}

// Sets given to Init (Horovod's hvd.init(process_sets=[...])) are there when Init returns,
// without dynamic process sets: ProcessSets has them in their order, nil where a rank is not a
// member; they run beside the job and each other, and adding more after Init still needs the
// dynamic setting, as in Horovod.
func TestProcessSetsGivenToInit(t *testing.T) {
	members := [][]int{{0, 2}, {1, 2}}
	hs, g := job(t, 3, WithProcessSets(members...))
	if n := g.splitCalls[0]; n != len(members) {
		t.Errorf("rank 0 split the job's backend %d times, want %d", n, len(members))
	}
	onEveryRank(t, hs, func(h *Horovod) error {
		sets := h.ProcessSets()
		if len(sets) != len(members) {
			return fmt.Errorf("rank %d: %d sets, want %d", h.Rank(), len(sets), len(members))
		}
		var wg sync.WaitGroup
		errs := make([]error, 1+len(sets))
		wg.Go(func() { errs[0] = checkSetCollectives(h, h, []int{0, 1, 2}) })
		for i, m := range members {
			if (sets[i] != nil) != slices.Contains(m, h.Rank()) {
				return fmt.Errorf("rank %d: set %v is %v", h.Rank(), m, sets[i])
			}
			if sets[i] != nil {
				wg.Go(func() { errs[i+1] = checkSetCollectives(h, sets[i], m) })
			}
		}
		wg.Wait()
		return errors.Join(errs...)
	})
	onEveryRank(t, hs, func(h *Horovod) error {
		if _, err := h.AddProcessSet([]int{0, 1}); err == nil || !strings.Contains(err.Error(), "process sets need HOROVOD_DYNAMIC_PROCESS_SETS=1") {
			return fmt.Errorf("rank %d: AddProcessSet without the dynamic setting: %v", h.Rank(), err)
		}
		return nil
	})
}

// Sets given to Init that some rank cannot have fail Init on every rank, naming the ranks and
// why, with nothing left waiting: sets that differ between ranks (they are negotiated one after
// another, as AddProcessSet's are), ranks outside the job, a backend that cannot split.
func TestProcessSetsGivenToInitFail(t *testing.T) {
	initFails := func(t *testing.T, g *loopback, opts func(r int) []Option, failed []int, want string) {
		t.Helper()
		done := make(chan []error)
		go func() {
			hs, errs := initRanks(g, opts)
			for _, h := range hs {
				if h != nil {
					h.Shutdown()
				}
			}
			done <- errs
		}()
		select {
		case errs := <-done:
			for r, err := range errs {
				var se *SetupError
				if errors.As(err, &se) && !slices.Equal(se.Failed, failed) {
					t.Errorf("rank %d: Init failed on ranks %v, want %v", r, se.Failed, failed)
				}
				if err == nil || !strings.Contains(err.Error(), want) {
					t.Errorf("rank %d: Init: %v, want an error containing %q", r, err, want)
				}
			}
		case <-time.After(10 * time.Second):
			t.Fatal("Init still waiting after 10 s")
		}
	}
	t.Run("sets differ", func(t *testing.T) {
		initFails(t, newLoopback(3), func(r int) []Option {
			switch r {
			case 0:
				return []Option{WithProcessSets([]int{0, 1}, []int{1, 2})}
			case 1:
				return []Option{WithProcessSets([]int{0, 1})}
			}
			return []Option{WithProcessSets([]int{0, 1}, []int{0, 2})}
		}, []int{1, 2}, "rank 1: its process sets given to Init (WithProcessSets) differ from rank 0's; rank 2: its process sets")
	})
	t.Run("sets on one rank", func(t *testing.T) {
		initFails(t, newLoopback(2), func(r int) []Option {
			if r == 1 {
				return []Option{WithProcessSets([]int{0, 1})}
			}
			return nil
		}, []int{1}, "rank 1: its process sets given to Init (WithProcessSets) differ from rank 0's")
	})
	t.Run("rank outside the job", func(t *testing.T) {
		initFails(t, newLoopback(2), func(int) []Option { return []Option{WithProcessSets([]int{0}, []int{0, 2})} },
			[]int{0, 1}, "process set 1 of WithProcessSets: ranks [0 2]: 2 is not a rank of a job of 2")
	})
	t.Run("backend cannot split", func(t *testing.T) {
		g := newLoopback(2)
		g.cannotSplit.Store(true)
		initFails(t, g, func(int) []Option { return []Option{WithProcessSets([]int{0}, []int{0, 1})} },
			nil, `horovod: Init: process set 0 of WithProcessSets, ranks [0]: horovod: process set "horovod.process_set": loopback: cannot split`)
	})
}

// A process set that the job's rank 0 is in writes its operations into the job's timeline, on
// rows named after the set, each rank's arrival marked by its rank in the job, beside the job's
// own row of the same tensor name; a set without rank 0 writes none.
func TestProcessSetTimeline(t *testing.T) {
	path := filepath.Join(t.TempDir(), "timeline.json")
	hs, _ := job(t, 3, WithDynamicProcessSets(), WithTimeline(path))
	sets := addSets(t, hs, []int{0, 2}, []int{1, 2})
	onEveryRank(t, hs, func(h *Horovod) error {
		x := mustTensor(t, nil, []float32{1, 2})
		for _, set := range append([]*Horovod{h}, sets[h.Rank()]...) {
			if set == nil {
				continue
			}
			if _, err := set.Allreduce("x", x, AllreduceOptions{}); err != nil {
				return err
			}
		}
		return nil
	})
	phases, arrivals := timelineRows(t, shutdownAndReadTimeline(t, hs, path))
	want := []string{"NEGOTIATE_ALLREDUCE", "ALLREDUCE", "QUEUE", "LOOPBACK_ALLREDUCE"}
	for row, ranks := range map[string][]string{"x": {"0", "1", "2"}, "process set [0 2]: x": {"0", "2"}} {
		if !slices.Equal(phases[row], want) {
			t.Errorf("row %q: phases %v, want %v", row, phases[row], want)
		}
		if a := slices.Sorted(slices.Values(arrivals[row])); !slices.Equal(a, ranks) {
			t.Errorf("row %q: arrivals %v, want %v", row, a, ranks)
		}
	}
	for row := range phases {
		if strings.HasPrefix(row, "process set [1 2]") {
			t.Errorf("rank 0 wrote row %q of a set it is not in", row)
		}
	}
}
