package horovod

import (
	"slices"
	"testing"
	"time"
)

// Entries keep the order their names first appeared in, whichever rank announced them, and the
// time and busy time of that first appearance; settle removes the answered ones.
func TestMessageTable(t *testing.T) {
	tb := newMessageTable(3)
	t0 := time.Unix(100, 0)
	for i, a := range []struct {
		rank  int
		name  string
		first bool
	}{{1, "b", true}, {0, "a", true}, {0, "b", false}, {2, "b", false}, {2, "c", true}} {
		at, busy := t0.Add(time.Duration(i)*time.Second), time.Duration(i)*time.Millisecond
		if first := tb.add(a.rank, allreduceSpec(a.name, 1), at, busy); first != a.first {
			t.Errorf("add(rank %d, %s) first = %v", a.rank, a.name, first)
		}
	}
	if !slices.Equal(tb.order, []string{"b", "a", "c"}) {
		t.Errorf("order %v", tb.order)
	}
	b := tb.entries["b"]
	if b.specs[0] == nil || b.specs[1] == nil || b.specs[2] == nil || !b.firstSeen.Equal(t0) || b.busyAtFirstSeen != 0 {
		t.Errorf("entry b: %+v", b)
	}
	if e := tb.entries["a"]; e.specs[1] != nil || e.specs[2] != nil || !e.firstSeen.Equal(t0.Add(time.Second)) || e.busyAtFirstSeen != time.Millisecond {
		t.Errorf("entry a: %+v", e)
	}
	tb.settle([]*response{{spec: b.specs[0]}}, []string{"a", "c"})
	if _, ok := tb.entries["b"]; ok || !slices.Equal(tb.order, []string{"a", "c"}) || len(tb.entries) != 2 {
		t.Errorf("after settling b: order %v, %d entries", tb.order, len(tb.entries))
	}
}

// Once every rank has joined, the last is the one that joined in the latest cycle (the highest
// rank among several), and the next join starts from none.
func TestMessageTableJoin(t *testing.T) {
	tb := newMessageTable(3)
	tb.join(2)
	tb.cycle++
	tb.join(0)
	tb.join(2) // already joined: keeps its cycle
	if tb.lastJoined() != -1 {
		t.Fatal("a join completed without rank 1")
	}
	if !tb.joined(0) || tb.joined(1) || !tb.joined(2) {
		t.Errorf("joined: %v", tb.joinedAt)
	}
	tb.join(1)
	if last := tb.lastJoined(); last != 1 {
		t.Errorf("last joined %d, want 1 (rank 0 and 1 joined in the same, later cycle)", last)
	}
	if tb.joined(0) || tb.joined(1) || tb.joined(2) {
		t.Errorf("a completed join is not reset: %v", tb.joinedAt)
	}
}
