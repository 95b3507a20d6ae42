package horovod

import (
	"errors"
	"maps"
	"slices"
	"testing"
)

func requestNamed(name string) *request {
	return &request{spec: spec{name: name, kind: kindAllreduce, dtype: Float32}}
}

func names(reqs []*request) []string {
	var ns []string
	for _, r := range reqs {
		ns = append(ns, r.name)
	}
	return ns
}

// Requests are announced in submission order, stay in flight until taken, and a name in flight
// or given twice refuses the whole submission.
func TestTensorQueue(t *testing.T) {
	q := newTensorQueue()
	if err := q.push(3, []*request{requestNamed("a"), requestNamed("b")}); err != nil {
		t.Fatal(err)
	}
	if err := q.push(3, []*request{requestNamed("c")}); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		batch []*request
		why   string
	}{
		{[]*request{requestNamed("d"), requestNamed("a")}, "an operation of that name is already in flight on rank 3"},
		{[]*request{requestNamed("e"), requestNamed("e")}, "the call names it twice"},
	} {
		var he *Error
		err := q.push(3, c.batch)
		if !errors.As(err, &he) || he.Tensor != c.batch[1].name || he.Reason != "duplicate name: "+c.why+" (names must be unique among outstanding operations)" {
			t.Errorf("push %v: %v", names(c.batch), err)
		}
	}
	if got := names(q.popQueued()); !slices.Equal(got, []string{"a", "b", "c"}) {
		t.Errorf("queued %v, want [a b c]: a refused submission queues none of its requests", got)
	}
	if got := q.popQueued(); got != nil {
		t.Errorf("queued again: %v", names(got))
	}
	a := q.take("a")
	if a == nil || a.name != "a" || a.done == nil {
		t.Fatalf("take(a) = %+v", a)
	}
	if q.take("a") != nil || q.take("d") != nil {
		t.Error("take returned a request not in flight")
	}
	if err := q.push(3, []*request{requestNamed("a")}); err != nil {
		t.Errorf("a name taken out of flight is free again: %v", err)
	}
	pending := q.drain()
	if got := slices.Sorted(maps.Keys(pending)); !slices.Equal(got, []string{"a", "b", "c"}) {
		t.Errorf("drained %v, want [a b c]", got)
	}
	if q.popQueued() != nil || len(q.inflight) != 0 {
		t.Error("the queue is not empty after drain")
	}
}
