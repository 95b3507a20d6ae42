package horovod

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"
)

func TestAllreduceOpsAndScaling(t *testing.T) {
	hs, _ := job(t, 3)
	onEveryRank(t, hs, func(h *Horovod) error {
		r := float32(h.Rank())
		x := mustTensor(t, []int{2, 2}, []float32{r, -r, 2 * r, 10})
		for _, c := range []struct {
			o    AllreduceOptions
			want []float32
		}{
			{AllreduceOptions{Op: Sum}, []float32{3, -3, 6, 30}},
			{AllreduceOptions{}, []float32{1, -1, 2, 10}},
			{AllreduceOptions{Op: Min}, []float32{0, -2, 0, 10}},
			{AllreduceOptions{Op: Max}, []float32{2, 0, 4, 10}},
			{AllreduceOptions{Op: Product}, []float32{0, 0, 0, 1000}},
			{AllreduceOptions{Op: Product, Prescale: 0.5}, []float32{0, 0, 0, 125}},
			{AllreduceOptions{Op: Sum, Prescale: 0.5, Postscale: 4}, []float32{6, -6, 12, 60}},
			{AllreduceOptions{Op: Average, Postscale: 3}, []float32{3, -3, 6, 30}},
			// The same name, op and prescale as the last: only the postscale tells the cached
			// signature from this one.
			{AllreduceOptions{Op: Average, Postscale: 6}, []float32{6, -6, 12, 60}},
		} {
			got, err := h.Allreduce("x", x, c.o)
			if err != nil {
				return err
			}
			if v := mustValues[float32](got); !slices.Equal(v, c.want) || !slices.Equal(got.Shape, []int{2, 2}) {
				return fmt.Errorf("%+v: got %v %v, want %v", c.o, got.Shape, v, c.want)
			}
		}
		return nil
	})
}

// Every kind of disagreement fails on every rank with the same error, naming the tensor and who
// sent what.
func TestMismatchesFailIdenticallyOnEveryRank(t *testing.T) {
	hs, _ := job(t, 3)
	cases := []struct {
		name string
		run  func(h *Horovod) error
		want string
	}{
		{"shape", func(h *Horovod) error {
			shape := []int{2, 3}
			if h.Rank() == 1 {
				shape = []int{3, 2}
			}
			_, err := h.Allreduce("w", mustTensor(t, shape, make([]float32, 6)), AllreduceOptions{})
			return err
		}, `horovod: allreduce "w": mismatched shapes: [2 3] on ranks 0,2; [3 2] on rank 1`},
		{"dtype", func(h *Horovod) error {
			x := mustTensor(t, nil, make([]float32, 4))
			if h.Rank() == 2 {
				x = mustTensor(t, nil, make([]int32, 4))
			}
			_, err := h.Allreduce("d", x, AllreduceOptions{})
			return err
		}, `horovod: allreduce "d": mismatched data types: float32 on ranks 0,1; int32 on rank 2`},
		{"op", func(h *Horovod) error {
			_, err := h.Allreduce("o", mustTensor(t, nil, []int64{1}), AllreduceOptions{Op: ReduceOp(h.Rank() % 2)})
			return err
		}, `horovod: allreduce "o": mismatched reduce ops: average on ranks 0,2; sum on rank 1`},
		{"root", func(h *Horovod) error {
			_, err := h.Broadcast("b", mustTensor(t, nil, []int8{1}), min(h.Rank(), 1))
			return err
		}, `horovod: broadcast "b": mismatched root ranks: 0 on rank 0; 1 on ranks 1,2`},
		{"kind", func(h *Horovod) error {
			x := mustTensor(t, []int{1}, []float64{1})
			var err error
			if h.Rank() == 0 {
				_, err = h.Allgather("k", x)
			} else {
				_, err = h.Allreduce("k", x, AllreduceOptions{})
			}
			return err
		}, `horovod: allgather "k": mismatched operations: allgather on rank 0; allreduce on ranks 1,2`},
		{"allgather trailing dims", func(h *Horovod) error {
			_, err := h.Allgather("g", mustTensor(t, []int{1, 1 + h.Rank()/2}, make([]float32, 1+h.Rank()/2)))
			return err
		}, `horovod: allgather "g": mismatched shapes beyond the first dimension: [1] on ranks 0,1; [2] on rank 2`},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			var mu sync.Mutex
			got := map[int]string{}
			onEveryRank(t, hs, func(h *Horovod) error {
				err := c.run(h)
				var he *Error
				if !errors.As(err, &he) {
					return fmt.Errorf("want a *horovod.Error, got %v", err)
				}
				mu.Lock()
				got[h.Rank()] = err.Error()
				mu.Unlock()
				return nil
			})
			for r, msg := range got {
				if msg != c.want {
					t.Errorf("rank %d: %s\nwant %s", r, msg, c.want)
				}
			}
			// The job is still healthy afterwards.
			onEveryRank(t, hs, func(h *Horovod) error { return h.Barrier() })
		})
	}
}

func TestDuplicateNameInFlight(t *testing.T) {
	hs, _ := job(t, 2)
	x := mustTensor(t, nil, []int32{5})
	first, err := hs[0].AllreduceAsync("dup", x, AllreduceOptions{Op: Sum})
	if err != nil {
		t.Fatal(err)
	}
	_, err = hs[0].AllreduceAsync("dup", x, AllreduceOptions{Op: Sum})
	if err == nil || !strings.Contains(err.Error(), `"dup": duplicate name`) {
		t.Fatalf("second submission of a name in flight: %v", err)
	}
	if _, err := hs[1].Allreduce("dup", x, AllreduceOptions{Op: Sum}); err != nil {
		t.Fatal(err)
	}
	got, err := first.Wait()
	if err != nil || mustValues[int32](got)[0] != 10 {
		t.Fatalf("first submission: %v %v", got, err)
	}
}

// groupedSizes submits one group of n float32 tensors of 256 elements (1 KiB) on every rank and
// returns how many backend allreduces rank 0 issued for it.
func groupedCalls(t *testing.T, threshold, n int) int64 {
	hs, g := job(t, 2, WithFusionThreshold(threshold))
	before := g.calls["allreduce"].Load()
	onEveryRank(t, hs, func(h *Horovod) error {
		ts := make([]NamedTensor, n)
		for i := range ts {
			v := make([]float32, 256)
			for j := range v {
				v[j] = float32(i*1000 + j + h.Rank())
			}
			ts[i] = NamedTensor{Name: fmt.Sprintf("t%d", i), Tensor: mustTensor(t, nil, v)}
		}
		out, err := h.GroupedAllreduce(ts, AllreduceOptions{Op: Sum})
		if err != nil {
			return err
		}
		for i, o := range out {
			for j, v := range mustValues[float32](o) {
				if want := float32(2*(i*1000+j) + 1); v != want {
					return fmt.Errorf("tensor %d element %d: %v, want %v", i, j, v, want)
				}
			}
		}
		return nil
	})
	return g.calls["allreduce"].Load() - before
}

func TestFusionThreshold(t *testing.T) {
	for _, c := range []struct{ threshold, n, calls int }{
		{DefaultFusionThreshold, 10, 1},
		{0, 10, 10},
		{4 << 10, 10, 3},
		{1 << 10, 4, 4},
	} {
		if got := groupedCalls(t, c.threshold, c.n); got != int64(c.calls) {
			t.Errorf("threshold %d, %d tensors of 1 KiB: %d backend allreduces, want %d", c.threshold, c.n, got, c.calls)
		}
	}
}

// Only allreduces that reduce alike fuse: a batch applies one dtype, op, prescale and postscale
// to the whole fusion buffer, so a member that differs in any of them would be reduced or scaled
// as the first member is.
func TestOnlyAlikeAllreducesFuse(t *testing.T) {
	first := spec{name: "a", kind: kindAllreduce, dtype: Float32, shape: []int{4}, op: Average, prescale: 1, postscale: 1}
	for _, c := range []struct {
		what   string
		change func(*spec)
		failed bool
		want   bool
	}{
		{"another name and shape", func(s *spec) { s.name, s.shape = "b", []int{2, 3} }, false, true},
		{"another dtype", func(s *spec) { s.dtype = Float64 }, false, false},
		{"another op", func(s *spec) { s.op = Sum }, false, false},
		{"another prescale", func(s *spec) { s.prescale = 0.5 }, false, false},
		{"another postscale", func(s *spec) { s.postscale = 2 }, false, false},
		{"a broadcast", func(s *spec) { s.kind = kindBroadcast }, false, false},
		{"a failed allreduce", func(*spec) {}, true, false},
	} {
		other := first
		c.change(&other)
		next := &response{spec: &other}
		if c.failed {
			next.err = &Error{Op: "allreduce", Tensor: other.name, Reason: "mismatched shapes"}
		}
		if got := fusable(&response{spec: &first}, next); got != c.want {
			t.Errorf("%s: fusable %v, want %v", c.what, got, c.want)
		}
	}
}

// After the first round, a repeated step announces its tensors by cache slot, not by description.
func TestNegotiationIsCached(t *testing.T) {
	hs, g := job(t, 2)
	g.recordGathers(true)
	step := func(shape0 []int) []error {
		errs := make([]error, 2)
		onEveryRank(t, hs, func(h *Horovod) error {
			ts := make([]NamedTensor, 40)
			for i := range ts {
				shape := []int{4}
				if h.Rank() == 0 && shape0 != nil {
					shape = shape0
				}
				ts[i] = NamedTensor{Name: fmt.Sprintf("model/layer_%02d/kernel/gradient", i), Tensor: mustTensor(t, shape, make([]float32, 4))}
			}
			_, errs[h.Rank()] = h.GroupedAllreduce(ts, AllreduceOptions{})
			return nil
		})
		return errs
	}
	measure := func(shape0 []int) (int, []error) {
		g.gathered.Store(0)
		errs := step(shape0)
		return int(g.gathered.Load()), errs
	}
	first, _ := measure(nil)
	second, _ := measure(nil)
	if second*10 > first {
		t.Errorf("negotiation bytes: first step %d, repeated step %d: want the repeat to be >10x smaller", first, second)
	}
	// A cached tensor whose shape changes on one rank is still caught.
	_, errs := measure([]int{2, 2})
	for r, err := range errs {
		if err == nil || !strings.Contains(err.Error(), "mismatched shapes: [2 2] on rank 0; [4] on rank 1") {
			t.Errorf("rank %d after a shape change on rank 0: %v", r, err)
		}
	}
}

// A tensor one rank leaves out of its group (a gradient it does not have): every member fails
// on every rank, where the group used to wait for a member that never came.
func TestGroupsOfDifferentSizesFail(t *testing.T) {
	hs, _ := job(t, 2)
	errs := make([]error, 2)
	onEveryRankWithin(t, hs, "groups of 2 and 1 members", func(h *Horovod) error {
		x := mustTensor(t, nil, []float32{1})
		ts := []NamedTensor{{"p", x}, {"q", x}}
		if h.Rank() == 1 {
			ts = ts[:1]
		}
		_, errs[h.Rank()] = h.GroupedAllreduce(ts, AllreduceOptions{})
		return nil
	})
	for r, err := range errs {
		if err == nil || !strings.Contains(err.Error(), "ranks grouped different tensors in group.1: rank 0: [p q]; rank 1: [p]") {
			t.Errorf("rank %d: %v", r, err)
		}
	}
	onEveryRank(t, hs, func(h *Horovod) error { return h.Barrier() })
}

// A member that fails on its own (one rank grouped it, the other reduced it alone) fails its
// group: the group's other members fail too, on every rank, where they used to wait for good
// for a member that was gone (no stall warning either: every rank had submitted them), or
// succeed on one rank and fail on the other.
func TestAGroupFailsAsAWhole(t *testing.T) {
	x := mustTensor(t, nil, []float32{1})
	want := `group.1 fails as a whole: its member "q" failed: mismatched groups: group.1 on rank 0; no group on rank 1`

	// Rank 1 reduces q alone and fails, as rank 0 does; then it groups p alone, its group.1.
	hs, _ := job(t, 2)
	errs := make([]error, 2)
	onEveryRankWithin(t, hs, "a group whose member failed alone", func(h *Horovod) error {
		if h.Rank() == 0 {
			_, errs[0] = h.GroupedAllreduce([]NamedTensor{{"p", x}, {"q", x}}, AllreduceOptions{})
			return nil
		}
		if _, err := h.Allreduce("q", x, AllreduceOptions{}); err == nil {
			return errors.New("q reduced alone against a group")
		}
		_, errs[1] = h.GroupedAllreduce([]NamedTensor{{"p", x}}, AllreduceOptions{})
		return nil
	})
	if errs[0] == nil || !strings.Contains(errs[0].Error(), "mismatched groups") {
		t.Errorf("rank 0's group: %v", errs[0])
	}
	if errs[1] == nil || !strings.Contains(errs[1].Error(), `"p": `+want) {
		t.Errorf("rank 1's group: %v", errs[1])
	}
	onEveryRank(t, hs, func(h *Horovod) error { return h.Barrier() })

	// Rank 1's q, alone, is in the table before either group: it fails in the round p would
	// have succeeded in on both ranks.
	hs, _ = job(t, 2)
	q, err := hs[1].AllreduceAsync("q", x, AllreduceOptions{})
	if err != nil {
		t.Fatal(err)
	}
	onEveryRankWithin(t, hs, "groups beside a tensor reduced alone", func(h *Horovod) error {
		members := []NamedTensor{{"p", x}, {"q", x}}
		if h.Rank() == 1 {
			members = members[:1]
		}
		_, errs[h.Rank()] = h.GroupedAllreduce(members, AllreduceOptions{})
		return nil
	})
	if _, err := q.Wait(); err == nil {
		t.Error("q reduced alone against a group")
	}
	for r, err := range errs {
		if err == nil || !strings.Contains(err.Error(), `"p": `) {
			t.Errorf("rank %d's group: %v; want p to fail", r, err)
		}
	}
	if !strings.Contains(errs[1].Error(), want) {
		t.Errorf("rank 1's group: %v; want %q", errs[1], want)
	}
	onEveryRank(t, hs, func(h *Horovod) error { return h.Barrier() })

	// One member of a matching group has other shapes on the two ranks: the other member,
	// which agreed, fails with it (it used to be reduced on its own).
	onEveryRank(t, hs, func(h *Horovod) error {
		b := mustTensor(t, []int{1}, []float32{1})
		if h.Rank() == 1 {
			b = mustTensor(t, []int{2}, []float32{1, 2})
		}
		_, errs[h.Rank()] = h.GroupedAllreduce([]NamedTensor{{"a", x}, {"b", b}}, AllreduceOptions{})
		return nil
	})
	for r, err := range errs {
		if err == nil || !strings.Contains(err.Error(), `"a": group.2 fails as a whole: its member "b" failed: mismatched shapes`) {
			t.Errorf("rank %d's group with a member of other shapes: %v", r, err)
		}
	}
}

// onEveryRankWithin is onEveryRank failing the test when some rank has not returned after 10 s:
// what these tests look for is a wait that never ends.
func onEveryRankWithin(t *testing.T, hs []*Horovod, what string, f func(h *Horovod) error) {
	t.Helper()
	done := make(chan struct{})
	go func() {
		defer close(done)
		onEveryRank(t, hs, f)
	}()
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		t.Fatalf("%s: still waiting after 10 s", what)
	}
}

// A GroupedAllreduce that one rank refuses before submitting anything (a bad tensor, a name
// already in flight there) leaves that rank's count of groups where the others' is: the next
// groups still match.
func TestARefusedGroupLeavesTheGroupsInStep(t *testing.T) {
	hs, _ := job(t, 2)
	bad := Tensor{DType: Float32, Shape: []int{3}, Data: make([]byte, 4)}
	if _, err := hs[1].GroupedAllreduce([]NamedTensor{{"w", bad}}, AllreduceOptions{}); err == nil {
		t.Fatal("a tensor of 3 elements in 4 bytes was accepted")
	}
	x := mustTensor(t, []int{1}, []float32{2})
	pending, err := hs[1].AllreduceAsync("x", x, AllreduceOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := hs[1].GroupedAllreduce([]NamedTensor{{"x", x}, {"y", x}}, AllreduceOptions{}); err == nil {
		t.Fatal("a group naming an allreduce in flight on its rank was accepted")
	}
	if _, err := hs[0].Allreduce("x", x, AllreduceOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := pending.Wait(); err != nil {
		t.Fatal(err)
	}
	for range 2 {
		onEveryRank(t, hs, func(h *Horovod) error {
			x := mustTensor(t, []int{1}, []float32{2})
			out, err := h.GroupedAllreduce([]NamedTensor{{"u", x}, {"v", x}}, AllreduceOptions{Op: Sum})
			if err == nil && mustValues[float32](out[1])[0] != 4 {
				err = fmt.Errorf("v summed to %v, want 4", mustValues[float32](out[1]))
			}
			return err
		})
	}
}

// A shape whose byte count wraps around an int (here to 0, which empty data would match) is
// refused, naming the tensor.
func TestShapePastAnIntIsRefused(t *testing.T) {
	hs, _ := job(t, 1)
	huge := Tensor{DType: Float32, Shape: []int{1 << 62, 4}}
	_, err := hs[0].Allgather("huge", huge)
	if err == nil || !strings.Contains(err.Error(), `"huge"`) || !strings.Contains(err.Error(), "more bytes than an int counts") {
		t.Errorf("shape %v with no data: %v", huge.Shape, err)
	}
	empty := Tensor{DType: Float32, Shape: []int{1 << 62, 4, 0}}
	if _, err := hs[0].Allgather("empty", empty); err != nil {
		t.Errorf("shape %v (no elements): %v", empty.Shape, err)
	}
}

func TestGroupsMustMatch(t *testing.T) {
	hs, _ := job(t, 2)
	errs := make([]error, 2)
	onEveryRank(t, hs, func(h *Horovod) error {
		other := "b"
		if h.Rank() == 1 {
			other = "c"
		}
		x := mustTensor(t, nil, []float32{1})
		_, errs[h.Rank()] = h.GroupedAllreduce([]NamedTensor{{"a", x}, {other, x}}, AllreduceOptions{})
		return nil
	})
	for r, err := range errs {
		if err == nil || !strings.Contains(err.Error(), "ranks grouped different tensors in group.1: rank 0: [a b]; rank 1: [a c]") {
			t.Errorf("rank %d: %v", r, err)
		}
	}
	onEveryRank(t, hs, func(h *Horovod) error { return h.Barrier() })

	// One rank groups a tensor, the other reduces it alone: an error, not a wait.
	onEveryRank(t, hs, func(h *Horovod) error {
		x := mustTensor(t, nil, []float32{1})
		if h.Rank() == 0 {
			_, errs[0] = h.GroupedAllreduce([]NamedTensor{{"lonely", x}}, AllreduceOptions{})
		} else {
			_, errs[1] = h.Allreduce("lonely", x, AllreduceOptions{})
		}
		return nil
	})
	for r, err := range errs {
		if err == nil || !strings.Contains(err.Error(), `"lonely": mismatched groups: group.2 on rank 0; no group on rank 1`) {
			t.Errorf("rank %d: %v", r, err)
		}
	}
}

func TestJoin(t *testing.T) {
	hs, _ := job(t, 3)
	last := make([]int, 3)
	onEveryRank(t, hs, func(h *Horovod) error {
		var err error
		if h.Rank() == 1 { // out of data first
			last[1], err = h.Join()
			return err
		}
		x := mustTensor(t, nil, []float64{float64(h.Rank() + 1)})
		sum, err := h.Allreduce("s", x, AllreduceOptions{Op: Sum})
		if err != nil {
			return err
		}
		avg, err := h.Allreduce("a", x, AllreduceOptions{})
		if err != nil {
			return err
		}
		if s, a := mustValues[float64](sum)[0], mustValues[float64](avg)[0]; s != 4 || a != 4.0/3 {
			return fmt.Errorf("with rank 1 joined: sum %v avg %v, want 4 and 4/3", s, a)
		}
		rows, err := h.Allgather("g", mustTensor(t, []int{h.Rank() + 1}, slices.Repeat([]int64{int64(h.Rank())}, h.Rank()+1)))
		if err != nil {
			return err
		}
		if v := mustValues[int64](rows); !slices.Equal(v, []int64{0, 2, 2, 2}) {
			return fmt.Errorf("allgather with rank 1 joined: %v", v)
		}
		if h.Rank() == 2 {
			time.Sleep(20 * time.Millisecond) // join last
		}
		last[h.Rank()], err = h.Join()
		return err
	})
	if !slices.Equal(last, []int{2, 2, 2}) {
		t.Errorf("last joined rank as seen by each rank: %v, want 2 everywhere", last)
	}
	onEveryRank(t, hs, func(h *Horovod) error { return h.Barrier() })
}

// A rank that has joined takes part in the others' groups without calling GroupedAllreduce:
// once every rank has joined, the ranks' next groups still match.
func TestGroupsWhileARankHasJoined(t *testing.T) {
	hs, _ := job(t, 2)
	onEveryRank(t, hs, func(h *Horovod) error {
		if h.Rank() == 1 { // out of data first
			_, err := h.Join()
			return err
		}
		x := mustTensor(t, nil, []float32{1})
		out, err := h.GroupedAllreduce([]NamedTensor{{"u", x}, {"v", x}}, AllreduceOptions{Op: Sum})
		if err != nil {
			return err
		}
		if v := mustValues[float32](out[1])[0]; v != 1 {
			return fmt.Errorf("v summed to %v with rank 1 joined, want 1", v)
		}
		_, err = h.Join()
		return err
	})
	onEveryRank(t, hs, func(h *Horovod) error {
		x := mustTensor(t, nil, []float32{1})
		out, err := h.GroupedAllreduce([]NamedTensor{{"u", x}, {"v", x}}, AllreduceOptions{Op: Sum})
		if err == nil && mustValues[float32](out[1])[0] != 2 {
			err = fmt.Errorf("v summed to %v, want 2", mustValues[float32](out[1]))
		}
		return err
	})
}

func TestStallWarningNamesTensorsAndRanks(t *testing.T) {
	g := newLoopback(3)
	var logs [3]syncBuffer
	hs, errs := initRanks(g, func(r int) []Option {
		return []Option{WithLogOutput(&logs[r]), WithStallCheck(50*time.Millisecond, 0)}
	})
	if err := errors.Join(errs...); err != nil {
		t.Fatal(err)
	}
	for _, h := range hs {
		defer h.Shutdown()
	}
	x := mustTensor(t, nil, []float32{1})
	h0, _ := hs[0].AllreduceAsync("lonely", x, AllreduceOptions{})
	h2, _ := hs[2].AllreduceAsync("lonely", x, AllreduceOptions{})
	time.Sleep(300 * time.Millisecond)
	if _, err := hs[1].Allreduce("lonely", x, AllreduceOptions{}); err != nil {
		t.Fatal(err)
	}
	for _, h := range []*Handle{h0, h2} {
		if _, err := h.Wait(); err != nil {
			t.Fatal(err)
		}
	}
	if got := logs[0].String(); !strings.Contains(got, "Missing ranks:\n1: [lonely]\n") {
		t.Errorf("rank 0 logged:\n%s", got)
	}
	// Rank 1 may say that it did not run for a while itself (a loaded machine starves it of
	// CPU): that is its own account, not the report of missing ranks, which is rank 0's alone.
	if strings.Contains(logs[1].String(), "Missing ranks") {
		t.Errorf("only rank 0 reports missing ranks; rank 1 logged %q", logs[1].String())
	}
}

type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

func TestStallShutdownAborts(t *testing.T) {
	g := newLoopback(2)
	var logs [2]syncBuffer
	hs, errs := initRanks(g, func(r int) []Option {
		return []Option{WithLogOutput(&logs[r]), WithStallCheck(0, 100*time.Millisecond)}
	})
	if err := errors.Join(errs...); err != nil {
		t.Fatal(err)
	}
	// Rank 1 never submits "never": the job must abort, not wait. (The ranks are abandoned
	// afterwards: an aborted job has nothing to shut down.) Both ranks' tables hold the stall;
	// whichever aborts first says why.
	if _, err := hs[0].AllreduceAsync("never", mustTensor(t, nil, []float32{1}), AllreduceOptions{}); err != nil {
		t.Fatal(err)
	}
	var r int
	select {
	case r = <-g.aborted:
	case <-time.After(5 * time.Second):
		t.Fatal("no abort 5s after a 100ms stall shutdown time")
	}
	if got := logs[r].String(); !strings.Contains(got, `aborting the job`) || !strings.Contains(got, "\n1!: [never]\n") {
		t.Errorf("rank %d logged:\n%s", r, got)
	}
	// HOROVOD_STALL_CHECK_TIME_SECONDS=0 turns the warnings off; the shutdown still applies.
	if got := logs[r].String(); strings.Contains(got, "stall:") {
		t.Errorf("rank %d warned with a zero stall-check time:\n%s", r, got)
	}
}

func TestShutdownOnOneRankFailsTheOthersPendingOps(t *testing.T) {
	hs, _ := job(t, 2)
	hd, err := hs[1].AllreduceAsync("orphan", mustTensor(t, nil, []float32{1}), AllreduceOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if err := hs[0].Shutdown(); err != nil {
		t.Fatal(err)
	}
	if _, err := hd.Wait(); !errors.Is(err, ErrShutdown) || !strings.Contains(err.Error(), "rank 0") {
		t.Fatalf("pending op after rank 0 shut down: %v", err)
	}
	if _, err := hs[1].Allreduce("late", mustTensor(t, nil, []float32{1}), AllreduceOptions{}); !errors.Is(err, ErrShutdown) {
		t.Fatalf("op submitted after shutdown: %v", err)
	}
}

// timelineEvent is one trace event of a timeline file.
type timelineEvent struct {
	Name string            `json:"name"`
	Ph   string            `json:"ph"`
	TS   int64             `json:"ts"`
	PID  int               `json:"pid"`
	Args map[string]string `json:"args"`
}

// shutdownAndReadTimeline shuts every rank down (which closes the timeline) and reads the
// events rank 0 wrote to path.
func shutdownAndReadTimeline(t *testing.T, hs []*Horovod, path string) []timelineEvent {
	t.Helper()
	for _, h := range hs {
		if err := h.Shutdown(); err != nil {
			t.Fatal(err)
		}
	}
	raw, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var events []timelineEvent
	if err := json.Unmarshal(raw, &events); err != nil {
		t.Fatalf("timeline is not a JSON array of events: %v\n%s", err, raw)
	}
	return events
}

// The timeline is a JSON array of trace events in which each tensor's row nests the phases in
// Horovod's order.
func TestTimelinePhases(t *testing.T) {
	path := filepath.Join(t.TempDir(), "timeline.json")
	hs, _ := job(t, 2, WithTimeline(path))
	onEveryRank(t, hs, func(h *Horovod) error {
		x := mustTensor(t, []int{2}, []float32{1, 2})
		if _, err := h.GroupedAllreduce([]NamedTensor{{"fused/a", x}, {"fused/b", x}}, AllreduceOptions{}); err != nil {
			return err
		}
		if _, err := h.Allreduce("single", x, AllreduceOptions{}); err != nil {
			return err
		}
		_, err := h.Broadcast("bcast", x, 1)
		return err
	})
	phases, arrivals := timelineRows(t, shutdownAndReadTimeline(t, hs, path))
	want := map[string][]string{
		"fused/a": {"NEGOTIATE_ALLREDUCE", "ALLREDUCE", "QUEUE", "MEMCPY_IN_FUSION_BUFFER", "LOOPBACK_ALLREDUCE", "MEMCPY_OUT_FUSION_BUFFER"},
		"fused/b": {"NEGOTIATE_ALLREDUCE", "ALLREDUCE", "QUEUE", "MEMCPY_IN_FUSION_BUFFER", "LOOPBACK_ALLREDUCE", "MEMCPY_OUT_FUSION_BUFFER"},
		"single":  {"NEGOTIATE_ALLREDUCE", "ALLREDUCE", "QUEUE", "LOOPBACK_ALLREDUCE"},
		"bcast":   {"NEGOTIATE_BROADCAST", "BROADCAST", "QUEUE", "LOOPBACK_BCAST"},
	}
	for name, w := range want {
		if !slices.Equal(phases[name], w) {
			t.Errorf("%s: phases %v, want %v", name, phases[name], w)
		}
		if a := slices.Sorted(slices.Values(arrivals[name])); !slices.Equal(a, []string{"0", "1"}) {
			t.Errorf("%s: rank arrivals %v, want 0 and 1", name, a)
		}
	}
}

// timelineRows checks that every row of a timeline nests its phases and never goes back in
// time, and returns each row's phases in the order they began and its rank arrivals.
func timelineRows(t *testing.T, events []timelineEvent) (phases, arrivals map[string][]string) {
	t.Helper()
	rows := map[int]string{}
	phases = map[string][]string{} // tensor -> phases in order of their B events
	arrivals = map[string][]string{}
	depth := map[int]int{}
	lastTS := map[int]int64{}
	for _, e := range events {
		switch e.Ph {
		case "M":
			rows[e.PID] = e.Args["name"]
			continue
		case "B":
			depth[e.PID]++
			phases[rows[e.PID]] = append(phases[rows[e.PID]], e.Name)
		case "E":
			depth[e.PID]--
			if depth[e.PID] < 0 {
				t.Fatalf("%s: an end without a begin", rows[e.PID])
			}
		case "i":
			arrivals[rows[e.PID]] = append(arrivals[rows[e.PID]], e.Name)
		}
		if e.TS < lastTS[e.PID] {
			t.Errorf("%s: time goes backwards at %s", rows[e.PID], e.Name)
		}
		lastTS[e.PID] = e.TS
	}
	for pid, d := range depth {
		if d != 0 {
			t.Errorf("%s: %d phases left open", rows[pid], d)
		}
	}
	return phases, arrivals
}

func TestReducerAccumulatesCompressesAndAverages(t *testing.T) {
	hs, _ := job(t, 2)
	onEveryRank(t, hs, func(h *Horovod) error {
		red, err := h.NewReducer(ReducerOptions{Compression: FP16Compression, BackwardPassesPerStep: 2, AverageAggregatedGradients: true, GradientPredivideFactor: 2})
		if err != nil {
			return err
		}
		r := float32(h.Rank())
		for step := 0; step < 2; step++ {
			for pass := 0; pass < 2; pass++ {
				p := float32(pass)
				grads := []NamedTensor{
					{"w", mustTensor(t, []int{3}, []float32{r + p, 1.5, 1e5 * r})},
					{"steps", mustTensor(t, nil, []int64{int64(7 + h.Rank() + pass)})},
					{"w64", mustTensor(t, []int{3}, []float64{float64(r + p), 1.5, 1e5 * float64(r)})},
				}
				out, ready, err := red.Reduce(grads)
				if err != nil {
					return err
				}
				if ready != (pass == 1) {
					return fmt.Errorf("pass %d: ready=%v", pass, ready)
				}
				if !ready {
					continue
				}
				// w: mean over passes (r+0.5), then over ranks: 1. fp16 overflow of 1e5 on
				// rank 1 proves the wire was float16.
				w := mustValues[float32](out[0].Tensor)
				if w[0] != 1 || w[1] != 1.5 || !math.IsInf(float64(w[2]), 1) {
					return fmt.Errorf("step %d: w = %v, want [1 1.5 +Inf]", step, w)
				}
				// Integers pass compression untouched: ((7+8)/2 truncated, (8+9)/2) = 7, 8 -> mean 7.
				if s := mustValues[int64](out[1].Tensor); out[1].Name != "steps" || s[0] != 7 {
					return fmt.Errorf("step %d: steps = %v", step, s)
				}
				// float64 goes on the wire as float16 too: the same overflow.
				if w := mustValues[float64](out[2].Tensor); w[0] != 1 || w[1] != 1.5 || !math.IsInf(w[2], 1) {
					return fmt.Errorf("step %d: w64 = %v, want [1 1.5 +Inf]", step, w)
				}
			}
		}
		return nil
	})
}

func TestReducerRejectsMisuse(t *testing.T) {
	hs, _ := job(t, 1)
	h := hs[0]
	if _, err := h.NewReducer(ReducerOptions{Op: Max}); err == nil {
		t.Error("reducer with Max accepted")
	}
	if _, err := h.NewReducer(ReducerOptions{Op: Sum, GradientPredivideFactor: 4}); err == nil {
		t.Error("predivide with Sum accepted")
	}
	red, err := h.NewReducer(ReducerOptions{BackwardPassesPerStep: 2})
	if err != nil {
		t.Fatal(err)
	}
	x := mustTensor(t, nil, []float32{1})
	if _, _, err := red.Reduce([]NamedTensor{{"a", x}, {"a", x}}); err == nil || !strings.Contains(err.Error(), `"a" given twice`) {
		t.Errorf("duplicate gradient: %v", err)
	}
	if _, _, err := red.Reduce([]NamedTensor{{"a", x}}); err != nil {
		t.Fatal(err)
	}
	if _, _, err := red.Reduce([]NamedTensor{{"b", x}}); err == nil || !strings.Contains(err.Error(), `"b" appears in backward pass 2`) {
		t.Errorf("changed variable between passes: %v", err)
	}
}

func TestWireRoundTrip(t *testing.T) {
	m := &message{joined: true, cached: []byte{5, 0, 128}, groups: []cachedGroup{{"group.3", 2, []byte{6}}}, specs: []*spec{
		{name: "a/b", kind: kindAllreduce, dtype: Float16, shape: []int{3, 0, 7}, op: Max, prescale: 0.25, postscale: 3, group: "group.2", groupSize: 4},
		{name: "", kind: kindBroadcast, dtype: Int8, root: 5},
		{name: "a2a", kind: kindAlltoall, dtype: Int32, shape: []int{9, 2}, splits: []int{0, 1, 2, 0, 3, 0, 0, 3}},
	}}
	enc := m.encode(nil)
	got, err := decodeMessage(enc, 8)
	if err != nil {
		t.Fatal(err)
	}
	if got.shutdown || !got.joined || !bytes.Equal(got.cached, m.cached) || len(got.specs) != 3 ||
		len(got.groups) != 1 || got.groups[0].group != "group.3" || got.groups[0].size != 2 || !bytes.Equal(got.groups[0].cached, []byte{6}) ||
		!got.specs[0].equal(m.specs[0]) || !got.specs[1].equal(m.specs[1]) || !got.specs[2].equal(m.specs[2]) {
		t.Fatalf("round trip changed the message: %+v", got)
	}
	if ids := slices.Collect(bits(got.cached)); !slices.Equal(ids, []int{0, 2, 23}) {
		t.Fatalf("cache bits %v", ids)
	}
	for n := range len(enc) {
		if _, err := decodeMessage(enc[:n], 8); err == nil {
			t.Fatalf("a message truncated to %d of %d bytes decoded", n, len(enc))
		}
	}
}

func TestInitWithoutLauncherIsSizeOne(t *testing.T) {
	for _, v := range []string{"OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "PMI_RANK", "PMI_SIZE", "SLURM_PROCID", "SLURM_STEP_NUM_TASKS"} {
		t.Setenv(v, "")
		os.Unsetenv(v)
	}
	h, err := Init()
	if err != nil {
		t.Fatal(err)
	}
	defer h.Shutdown()
	if h.Size() != 1 || h.Rank() != 0 || h.LocalSize() != 1 || h.Backend() != "local" {
		t.Fatalf("rank %d of %d on %s", h.Rank(), h.Size(), h.Backend())
	}
	got, err := h.Allreduce("x", mustTensor(t, nil, []float32{3}), AllreduceOptions{})
	if err != nil || mustValues[float32](got)[0] != 3 {
		t.Fatalf("allreduce of one rank: %v %v", got, err)
	}
}

func TestBadEnvironmentIsAnError(t *testing.T) {
	t.Setenv("HOROVOD_FUSION_THRESHOLD", "lots")
	if _, err := Init(); err == nil || !strings.Contains(err.Error(), "HOROVOD_FUSION_THRESHOLD") {
		t.Fatalf("bad HOROVOD_FUSION_THRESHOLD: %v", err)
	}
	os.Unsetenv("HOROVOD_FUSION_THRESHOLD")
	t.Setenv("OMPI_COMM_WORLD_RANK", "4")
	t.Setenv("OMPI_COMM_WORLD_SIZE", "2")
	if _, err := Init(); err == nil || !strings.Contains(err.Error(), "OMPI_COMM_WORLD_RANK") {
		t.Fatalf("rank outside size: %v", err)
	}
}

// Gradients sliced from one flat buffer are reduced where they lie: one backend call, no copies
// into or out of a fusion buffer (in place with InPlace); scattered gradients are copied in, and
// the Reducer's own contiguous results need no copy out.
func TestReducerFusesInPlace(t *testing.T) {
	path := filepath.Join(t.TempDir(), "timeline.json")
	hs, g := job(t, 2, WithTimeline(path))
	before := g.calls["allreduce"].Load()
	onEveryRank(t, hs, func(h *Horovod) error {
		red, err := h.NewReducer(ReducerOptions{Prefix: "flat/"})
		if err != nil {
			return err
		}
		flat := make([]float32, 30)
		for i := range flat {
			flat[i] = float32(i * (h.Rank() + 1))
		}
		grads := []NamedTensor{
			{"a", mustTensor(t, []int{10}, flat[:10])},
			{"b", mustTensor(t, []int{2, 10}, flat[10:])},
		}
		scattered, err := h.NewReducer(ReducerOptions{Prefix: "scattered/"})
		if err != nil {
			return err
		}
		inPlace, err := h.NewReducer(ReducerOptions{Prefix: "inplace/", InPlace: true})
		if err != nil {
			return err
		}
		for _, red := range []*Reducer{red, scattered} {
			out, _, err := red.Reduce(grads)
			if err != nil {
				return err
			}
			for i, v := range append(mustValues[float32](out[0].Tensor), mustValues[float32](out[1].Tensor)...) {
				if want := float32(i) * 1.5; v != want {
					return fmt.Errorf("element %d: %v, want %v", i, v, want)
				}
			}
			grads = []NamedTensor{{"a", mustTensor(t, []int{10}, slices.Clone(flat[:10]))}, {"b", mustTensor(t, []int{2, 10}, slices.Clone(flat[10:]))}}
		}
		out, _, err := inPlace.Reduce([]NamedTensor{{"a", mustTensor(t, []int{10}, flat[:10])}, {"b", mustTensor(t, []int{2, 10}, flat[10:])}})
		if err != nil {
			return err
		}
		for i, v := range flat {
			if want := float32(i) * 1.5; v != want {
				return fmt.Errorf("in place: element %d of the flat buffer is %v, want %v", i, v, want)
			}
		}
		if &out[1].Data[0] != &mustTensor(t, nil, flat[10:]).Data[0] {
			return fmt.Errorf("in place: the result does not alias the gradient")
		}
		return nil
	})
	if n := g.calls["allreduce"].Load() - before; n != 3 {
		t.Errorf("%d backend allreduces for three steps of two gradients each, want 3", n)
	}
	for _, h := range hs {
		h.Shutdown()
	}
	raw, _ := os.ReadFile(path)
	var events []struct{ Name, Ph string }
	if err := json.Unmarshal(raw, &events); err != nil {
		t.Fatal(err)
	}
	copies := map[string]int{}
	for _, e := range events {
		if e.Ph == "B" && strings.HasPrefix(e.Name, "MEMCPY") {
			copies[e.Name]++
		}
	}
	// Only the scattered step copies, and only in: one phase per tensor.
	if !maps.Equal(copies, map[string]int{"MEMCPY_IN_FUSION_BUFFER": 2}) {
		t.Errorf("copy phases in the timeline: %v", copies)
	}
}

// Scaling a float32 rounds once whichever way it is computed: the float32 fast path for factors
// a float32 holds exactly agrees with the float64 product on random values.
func TestScaleFloat32RoundsOnce(t *testing.T) {
	// Factors a float32 holds exactly take the fast path.
	for _, f := range []float64{0.5, 3, 0.75, float64(float32(0.1)), float64(float32(1.0 / 3)), 1e-30} {
		v := make([]float32, 1000)
		want := make([]float32, len(v))
		for i := range v {
			v[i] = float32(math.Sin(float64(i))*1e3) + float32(i)*1e-4
			want[i] = float32(float64(v[i]) * f)
		}
		scale(mustTensor(t, nil, v).Data, Float32, f, 1)
		if !slices.Equal(v, want) {
			t.Errorf("factor %v: scaling differs from one rounding of the exact product", f)
		}
	}
}

// A backend failure ends the job (the other ranks could not complete without this one), after a
// message naming the rank, the operation and the cause.
func TestBackendFailureAbortsTheJob(t *testing.T) {
	g := newLoopback(2)
	var logs [2]syncBuffer
	path := filepath.Join(t.TempDir(), "timeline.json")
	// Abandoned after the abort, like the ranks of TestStallShutdownAborts.
	hs, errs := initRanks(g, func(r int) []Option { return []Option{WithLogOutput(&logs[r]), WithTimeline(path)} })
	if err := errors.Join(errs...); err != nil {
		t.Fatal(err)
	}
	g.failAllreduce.Store(true)
	handles := make([]*Handle, len(hs))
	for r, h := range hs {
		var err error
		if handles[r], err = h.AllreduceAsync("w", mustTensor(t, nil, []float32{1}), AllreduceOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	for range 2 {
		select {
		case <-g.aborted:
		case <-time.After(5 * time.Second):
			t.Fatal("no abort after a backend failure")
		}
	}
	// The failed allreduce's own request fails too, rather than leaving its caller waiting
	// (where the abort does not end the process, as here, Shutdown would wait with it).
	for r, hd := range handles {
		select {
		case <-hd.req.done:
			if _, err := hd.Wait(); err == nil || !strings.Contains(err.Error(), "link down") {
				t.Errorf("rank %d: the failed allreduce returned %v", r, err)
			}
		case <-time.After(5 * time.Second):
			t.Fatalf("rank %d: the failed allreduce never completed", r)
		}
	}
	for r := range logs {
		want := fmt.Sprintf(`horovod: rank %d: allreduce "w" on the loopback backend: link down: aborting the job`, r)
		if got := logs[r].String(); !strings.Contains(got, want) {
			t.Errorf("rank %d logged %q, want %q", r, got, want)
		}
	}
	// Rank 0's timeline holds, before the abort, the failed allreduce's events, as a trace
	// viewer reads a file without its closing bracket.
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var events []traceEvent
	if err := json.Unmarshal(append(b, ']'), &events); err != nil {
		t.Fatalf("the timeline of an aborted job does not read: %v\n%s", err, b)
	}
	phases := map[string]bool{}
	for _, e := range events {
		phases[e.Name] = true
	}
	if !phases["NEGOTIATE_ALLREDUCE"] || !phases["ALLREDUCE"] || !phases["LOOPBACK_ALLREDUCE"] {
		t.Errorf("the aborted job's timeline has phases %v, want the failed allreduce's", phases)
	}
}

// The timeline's file always ends at an event's end, so that a job killed at any point leaves a
// trace that reads, and flushNow writes every event so far.
func TestTimelineFileEndsAtAnEvent(t *testing.T) {
	path := filepath.Join(t.TempDir(), "timeline.json")
	tl := newTimeline()
	if err := tl.startFile(path); err != nil {
		t.Fatal(err)
	}
	defer tl.close()
	now := time.Now()
	for i := range 3000 { // past timelineBuffer, which writes the buffer out
		tl.begin(fmt.Sprintf("tensor/%d", i), "QUEUE", now)
	}
	read := func() []traceEvent {
		b, err := os.ReadFile(path)
		if err != nil {
			t.Fatal(err)
		}
		var events []traceEvent
		if err := json.Unmarshal(append(b, ']'), &events); err != nil {
			t.Fatalf("the timeline as written so far (%d bytes) does not read: %v", len(b), err)
		}
		return events
	}
	if n := len(read()); n == 0 || n >= tl.events {
		t.Errorf("%d of %d events written before a flush: want some, not all", n, tl.events)
	}
	tl.flushNow()
	if n := len(read()); n != tl.events {
		t.Errorf("%d of %d events written after flushNow", n, tl.events)
	}
}

// While no rank has anything to negotiate, the background loop's rounds back off to maxIdleWait
// (each costs every rank a collective: rounds every 16 ms made a computing rank's train step 2-3%
// slower) but do not stop: another rank's Shutdown and the stall check reach an idle rank in them.
func TestIdleRoundsBackOffButGoOn(t *testing.T) {
	// HOROVOD_CYCLE_TIME=0 (no wait between busy rounds) backs off from 1 ms as well.
	for _, cycle := range []time.Duration{time.Millisecond, 0} {
		t.Run(fmt.Sprintf("cycle time %v", cycle), func(t *testing.T) {
			hs, _ := job(t, 2, WithCycleTime(cycle))
			onEveryRank(t, hs, func(h *Horovod) error {
				_, err := h.Allreduce("before the idle time", mustTensor(t, nil, []float32{1}), AllreduceOptions{Op: Sum})
				return err
			})
			before := hs[0].LoopStats().Rounds
			const idleFor = 2500 * time.Millisecond
			time.Sleep(idleFor)
			rounds := hs[0].LoopStats().Rounds - before
			// Doubling from the 1 ms cycle time up to 1 s: 10 rounds in the first 1.02 s, then one a
			// second, and a few more for a round that a timer on the other rank started (a slow machine
			// runs fewer). Backing off to 16 ms, as before, ran about 150.
			const most = 10 + 2 + 3
			if rounds > most || rounds == 0 {
				t.Errorf("%d idle rounds in %v: want 1 to %d", rounds, idleFor, most)
			}
		})
	}
}

// A peer's alltoall splits that no rank would send (not one per rank, not summing to the first
// dimension, negative) and splits on another operation fail the round, naming the operation.
func TestDecodeRefusesBadSplits(t *testing.T) {
	for _, c := range []struct {
		s    *spec
		want string
	}{
		{&spec{name: "a", kind: kindAlltoall, dtype: Int32, shape: []int{3}, splits: []int{1, 2}}, `alltoall "a": 2 splits for 3 ranks`},
		{&spec{name: "a", kind: kindAlltoall, dtype: Int32, shape: []int{3}, splits: []int{1, 1, 0}}, `alltoall "a": splits [1 1 0] sum to 2 rows, not the first dimension 3`},
		{&spec{name: "a", kind: kindAlltoall, dtype: Int32, shape: []int{3}, splits: []int{4, -1, 0}}, `alltoall "a": splits [4 -1 0] do not divide`},
		{&spec{name: "a", kind: kindAlltoall, dtype: Int32, shape: []int{}, splits: []int{0, 0, 0}}, `alltoall "a": a scalar has no first dimension`},
		{&spec{name: "s", kind: kindReducescatter, dtype: Int32, shape: []int{}}, `reducescatter "s": a scalar has no first dimension`},
		{&spec{name: "g", kind: kindAllgather, dtype: Int32, shape: []int{3}, splits: []int{1, 1, 1}}, `allgather "g": splits are an alltoall's`},
		{&spec{name: "a", kind: kindAlltoall, dtype: Int32, shape: []int{3}, splits: []int{0, 0, 0, 3}}, `alltoall "a": 4 splits in a job of 3 ranks`},
	} {
		enc := (&message{specs: []*spec{c.s}}).encode(nil)
		if _, err := decodeMessage(enc, 3); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%+v: %v, want %q", c.s, err, c.want)
		}
	}
}
