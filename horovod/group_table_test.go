package horovod

import (
	"testing"
	"time"
)

func grouped(name, group string, size int) *spec {
	s := allreduceSpec(name, 1)
	s.group, s.groupSize = group, size
	return s
}

// A group is complete once every rank that has not joined announced all its members, and
// mismatched when the ranks put different tensors in it, or different numbers of them.
func TestGroupTable(t *testing.T) {
	now := time.Now()
	tb := newMessageTable(3)
	tb.add(0, grouped("x", "g1", 2), now, 0)
	tb.add(0, grouped("y", "g1", 2), now, 0)
	tb.add(1, grouped("x", "g1", 2), now, 0)
	tb.add(1, grouped("y", "g1", 2), now, 0)
	tb.add(2, grouped("x", "g1", 2), now, 0)
	g := newGroupTable(tb)
	if g.complete("g1") {
		t.Error("g1 complete while rank 2 announced one member of 2")
	}
	tb.join(2)
	if g := newGroupTable(tb); !g.complete("g1") || g.mismatch("g1") != "" {
		t.Errorf("g1 with rank 2 joined: complete %v, mismatch %q", g.complete("g1"), g.mismatch("g1"))
	}

	tb = newMessageTable(2)
	tb.add(0, grouped("x", "g2", 2), now, 0)
	tb.add(0, grouped("y", "g2", 2), now, 0)
	tb.add(1, grouped("x", "g2", 2), now, 0)
	tb.add(1, grouped("z", "g2", 2), now, 0)
	g = newGroupTable(tb)
	if !g.complete("g2") {
		t.Error("g2 not complete with two members on each rank")
	}
	const want = "ranks grouped different tensors in g2: rank 0: [x y]; rank 1: [x z]"
	if got := g.mismatch("g2"); got != want {
		t.Errorf("mismatch: %q, want %q", got, want)
	}

	// A tensor one rank left out of its group (a gradient it does not have): each rank's
	// members are all there, and the group fails rather than wait for a member that never comes.
	tb = newMessageTable(2)
	tb.add(0, grouped("x", "g3", 2), now, 0)
	tb.add(0, grouped("y", "g3", 2), now, 0)
	tb.add(1, grouped("x", "g3", 1), now, 0)
	g = newGroupTable(tb)
	if !g.complete("g3") {
		t.Error("g3 not complete with every rank's members announced")
	}
	const want3 = "ranks grouped different tensors in g3: rank 0: [x y]; rank 1: [x]"
	if got := g.mismatch("g3"); got != want3 {
		t.Errorf("mismatch: %q, want %q", got, want3)
	}
}
