package horovod

import (
	"strings"
	"testing"
)

func allreduceSpec(name string, n int) *spec {
	return &spec{name: name, kind: kindAllreduce, dtype: Float32, shape: []int{n}, op: Sum, prescale: 1, postscale: 1}
}

// A slot holds an agreed signature until the same name is agreed with another; the group is no
// part of it; allgathers are never cached; a full cache remembers nothing new.
func TestResponseCache(t *testing.T) {
	rc := newResponseCache(2)
	a, b := allreduceSpec("a", 4), allreduceSpec("b", 8)
	rc.remember(a)
	rc.remember(&spec{name: "g", kind: kindAllgather, dtype: Float32, shape: []int{3}})
	rc.remember(b)
	rc.remember(allreduceSpec("c", 1)) // full
	for _, tc := range []struct {
		s    *spec
		slot int
		ok   bool
	}{
		{allreduceSpec("a", 4), 0, true},
		{&spec{name: "a", kind: kindAllreduce, dtype: Float32, shape: []int{4}, op: Sum, prescale: 1, postscale: 1, group: "grp.1", groupSize: 2}, 0, true},
		{allreduceSpec("b", 8), 1, true},
		{allreduceSpec("a", 5), 0, false},
		{allreduceSpec("c", 1), 0, false},
		{&spec{name: "g", kind: kindAllgather, dtype: Float32, shape: []int{3}}, 0, false},
	} {
		if id, ok := rc.slot(tc.s); ok != tc.ok || (ok && id != tc.slot) {
			t.Errorf("slot(%s %v group %q) = %d, %v; want %d, %v", tc.s.name, tc.s.shape, tc.s.group, id, ok, tc.slot, tc.ok)
		}
	}
	rc.remember(allreduceSpec("a", 5)) // a new signature for a takes a's slot
	if id, ok := rc.slot(allreduceSpec("a", 5)); !ok || id != 0 {
		t.Errorf("after a changed shape: slot %d, %v", id, ok)
	}
	if _, ok := rc.slot(a); ok {
		t.Error("the old signature of a is still cached")
	}

	s, err := rc.spec(1, "grp.7", 2)
	if err != nil || !s.sameSignature(b) || s.group != "grp.7" || s.groupSize != 2 {
		t.Fatalf("spec(1) = %+v, %v", s, err)
	}
	if b.group != "" {
		t.Error("spec changed the cached spec's group")
	}
	if _, err := rc.spec(2, "", 0); err == nil || !strings.Contains(err.Error(), "negotiation cache slot 2 of 2: ranks disagree about the cache") {
		t.Errorf("spec past the end: %v", err)
	}
	off := newResponseCache(0)
	off.remember(a)
	if _, ok := off.slot(a); ok {
		t.Error("a cache of capacity 0 remembered a signature")
	}
}
