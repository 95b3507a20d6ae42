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

	// Both ranks announce all their members, but not the same ones: the ranks put different
	// tensors in g2, or (a gradient one rank does not have) different numbers of them in g3.
	for _, c := range []struct {
		group string
		ranks [2][]string // each rank's members
		want  string
	}{
		{"g2", [2][]string{{"x", "y"}, {"x", "z"}}, "ranks grouped different tensors in g2: rank 0: [x y]; rank 1: [x z]"},
		{"g3", [2][]string{{"x", "y"}, {"x"}}, "ranks grouped different tensors in g3: rank 0: [x y]; rank 1: [x]"},
	} {
		tb = newMessageTable(2)
		for r, members := range c.ranks {
			for _, name := range members {
				tb.add(r, grouped(name, c.group, len(members)), now, 0)
			}
		}
		g := newGroupTable(tb)
		if !g.complete(c.group) {
			t.Errorf("%s not complete with every rank's members announced", c.group)
		}
		if got := g.mismatch(c.group); got != c.want {
			t.Errorf("mismatch: %q, want %q", got, c.want)
		}
	}
}
