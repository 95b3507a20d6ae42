package horovod

import (
	"math"
	"slices"
	"strings"
	"testing"
	"time"
)

// When several ranks ask to shut down in one round, every rank names the lowest of them.
func TestShutdownNamesTheLowestRankThatAsked(t *testing.T) {
	c := &controller{table: newMessageTable(3)}
	if stopBy, err := c.apply([]*message{{}, {shutdown: true}, {shutdown: true}}, time.Now()); err != nil || stopBy != 1 {
		t.Errorf("stopBy %d (%v), want 1", stopBy, err)
	}
}

// A request whose signature the cache holds is announced by its slot, grouped requests by
// group; others, and one whose signature changed, in full.
func TestAnnounce(t *testing.T) {
	rc := newResponseCache(8)
	for _, n := range []string{"a", "b", "c", "d"} {
		rc.remember(allreduceSpec(n, 1))
	}
	req := func(s *spec) *request { return &request{spec: *s} }
	m := announce(rc, []*request{
		req(allreduceSpec("c", 1)),
		req(grouped("d", "grp.2", 2)),
		req(allreduceSpec("new", 1)),
		req(allreduceSpec("a", 3)), // signature changed
		req(grouped("b", "grp.2", 2)),
		req(allreduceSpec("a", 1)),
	}, false, true)
	if m.shutdown || !m.joined {
		t.Errorf("flags: shutdown %v joined %v", m.shutdown, m.joined)
	}
	if got := slices.Collect(bits(m.cached)); !slices.Equal(got, []int{0, 2}) {
		t.Errorf("cached slots %v, want [0 2]", got)
	}
	if len(m.groups) != 1 || m.groups[0].group != "grp.2" || m.groups[0].size != 2 || !slices.Equal(slices.Collect(bits(m.groups[0].cached)), []int{1, 3}) {
		t.Errorf("groups %+v", m.groups)
	}
	if len(m.specs) != 2 || m.specs[0].name != "new" || m.specs[1].name != "a" || m.specs[1].shape[0] != 3 {
		t.Errorf("specs %+v", m.specs)
	}
}

// Ranks that disagree get one error naming the field and each value's ranks; a joined rank
// (nil spec) is left out, and an allgather's response has each rank's first dimension.
func TestAgree(t *testing.T) {
	a := allreduceSpec("w", 4)
	b := allreduceSpec("w", 5)
	resp := agree("w", &entry{specs: []*spec{a, b, nil, a}}, 4)
	if resp.err == nil || resp.err.Reason != "mismatched shapes: [4] on ranks 0,3; [5] on rank 1" {
		t.Errorf("shapes: %v", resp.err)
	}
	if resp := agree("w", &entry{specs: []*spec{a, nil, a}}, 3); resp.err != nil || resp.spec != a {
		t.Errorf("agreeing ranks: %+v", resp)
	}
	g0 := &spec{name: "g", kind: kindAllgather, dtype: Int32, shape: []int{2, 3}}
	g1 := &spec{name: "g", kind: kindAllgather, dtype: Int32, shape: []int{5, 3}}
	if resp := agree("g", &entry{specs: []*spec{g0, nil, g1}}, 3); resp.err != nil || !slices.Equal(resp.firstDims, []int{2, 0, 5}) {
		t.Errorf("allgather: %+v", resp)
	}
	// Each part fits an int of bytes, their sum does not: a damaged first dimension fails the
	// operation instead of sizing its result negative.
	huge := &spec{name: "g", kind: kindAllgather, dtype: Int32, shape: []int{math.MaxInt / 12, 3}}
	if resp := agree("g", &entry{specs: []*spec{huge, g1}}, 2); resp.err == nil || !strings.Contains(resp.err.Reason, "gather more bytes than an int counts") {
		t.Errorf("allgather of %d+5 rows of 12 bytes: %+v (%d bytes)", huge.shape[0], resp.err, gatheredBytes(resp))
	}
	a0 := &spec{name: "a", kind: kindAlltoall, dtype: Int32, shape: []int{3, 2}, splits: []int{1, 2}}
	a1 := &spec{name: "a", kind: kindAlltoall, dtype: Int32, shape: []int{4, 2}, splits: []int{4, 0}}
	if resp := agree("a", &entry{specs: []*spec{a0, a1}}, 2); resp.err != nil || !slices.Equal(resp.splits[0], a0.splits) || !slices.Equal(resp.splits[1], a1.splits) {
		t.Errorf("alltoall: %+v", resp)
	}
	// Rank 0 would receive rank 0's and rank 1's rows for it: past an int of bytes together.
	hugeA := &spec{name: "a", kind: kindAlltoall, dtype: Int32, shape: []int{math.MaxInt / 12, 3}, splits: []int{math.MaxInt / 12, 0}}
	a1.shape[1], a1.splits = 3, []int{4, 0}
	if resp := agree("a", &entry{specs: []*spec{hugeA, a1}}, 2); resp.err == nil || !strings.Contains(resp.err.Reason, "rank 0 would receive more bytes than an int counts") {
		t.Errorf("alltoall past an int of bytes: %+v", resp.err)
	}
	rs0 := &spec{name: "s", kind: kindReducescatter, dtype: Float32, shape: []int{4}, op: Sum, prescale: 1, postscale: 1}
	rs1 := &spec{name: "s", kind: kindReducescatter, dtype: Float32, shape: []int{4}, op: Max, prescale: 1, postscale: 1}
	if resp := agree("s", &entry{specs: []*spec{rs0, rs1}}, 2); resp.err == nil || resp.err.Reason != "mismatched reduce ops: sum on rank 0; max on rank 1" {
		t.Errorf("reducescatter: %+v", resp.err)
	}
	root := &spec{name: "r", kind: kindBroadcast, dtype: Int32, shape: []int{1}, root: 1}
	if resp := agree("r", &entry{specs: []*spec{root, nil}}, 2); resp.err == nil || resp.err.Reason != "root rank 1 has joined" {
		t.Errorf("broadcast from a joined root: %+v", resp.err)
	}
}
