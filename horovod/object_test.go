package horovod

import (
	"fmt"
	"reflect"
	"strings"
	"testing"
)

// trainingState stands for what a program broadcasts as an object: a resumed step, a schedule,
// names, a map.
type trainingState struct {
	Step   int
	LR     float64
	Names  []string
	Counts map[string]int
}

func stateOf(rank int) trainingState {
	names := make([]string, rank+1) // a different length on every rank
	for i := range names {
		names[i] = fmt.Sprintf("r%d-%d", rank, i)
	}
	return trainingState{Step: 100 * rank, LR: 1e-4 * float64(rank+1), Names: names, Counts: map[string]int{"rank": rank}}
}

// BroadcastObject gives every rank root's value, from any root, whatever the others pass; the
// result shares no memory with root's value.
func TestBroadcastObject(t *testing.T) {
	hs, _ := job(t, 3)
	for root := range 3 {
		onEveryRank(t, hs, func(h *Horovod) error {
			mine := stateOf(h.Rank())
			got, err := BroadcastObject(h, fmt.Sprintf("state%d", root), mine, root)
			if err != nil {
				return err
			}
			if want := stateOf(root); !reflect.DeepEqual(got, want) {
				return fmt.Errorf("root %d: got %+v, want %+v", root, got, want)
			}
			mine.Names[0] = "changed"
			if got.Names[0] == "changed" {
				return fmt.Errorf("root %d: the result shares the caller's slice", root)
			}
			return nil
		})
	}
}

// AllgatherObject returns every rank's value in rank order.
func TestAllgatherObject(t *testing.T) {
	hs, _ := job(t, 3)
	onEveryRank(t, hs, func(h *Horovod) error {
		got, err := AllgatherObject(h, "states", stateOf(h.Rank()))
		if err != nil {
			return err
		}
		want := []trainingState{stateOf(0), stateOf(1), stateOf(2)}
		if !reflect.DeepEqual(got, want) {
			return fmt.Errorf("got %+v, want %+v", got, want)
		}
		return nil
	})
}

// A value gob cannot encode fails on the rank that holds it with gob's error and on the others
// with an error naming that rank, instead of leaving them waiting for its bytes; a type that
// does not decode what root sent fails on the rank that asked for it. The job goes on.
func TestObjectErrors(t *testing.T) {
	hs, _ := job(t, 3)
	unencodable := map[string]any{"f": func() {}} // gob encodes no functions
	errs := make([]error, 3)
	onEveryRankWithin(t, hs, "a root that cannot encode its object", func(h *Horovod) error {
		v := map[string]any{"step": 1}
		if h.Rank() == 1 {
			v = unencodable
		}
		_, errs[h.Rank()] = BroadcastObject(h, "bad", v, 1)
		return nil
	})
	for r, err := range errs {
		want := "root rank 1 could not encode its object"
		if r == 1 {
			want = "encoding this rank's map[string]interface {} with gob"
		}
		if err == nil || !strings.Contains(err.Error(), `broadcast_object "bad"`) || !strings.Contains(err.Error(), want) {
			t.Errorf("rank %d: %v, want %q", r, err, want)
		}
	}
	onEveryRankWithin(t, hs, "a rank that cannot encode its object", func(h *Horovod) error {
		v := map[string]any{"step": 1}
		if h.Rank() == 2 {
			v = unencodable
		}
		_, errs[h.Rank()] = AllgatherObject(h, "bad", v)
		return nil
	})
	for r, err := range errs {
		want := "rank 2 could not encode its object"
		if r == 2 {
			want = "encoding this rank's"
		}
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("allgather, rank %d: %v, want %q", r, err, want)
		}
	}
	type other struct{ Unrelated string }
	onEveryRankWithin(t, hs, "a rank asking for another type", func(h *Horovod) error {
		if h.Rank() == 2 {
			_, errs[2] = BroadcastObject(h, "typed", other{}, 0)
		} else {
			_, errs[h.Rank()] = BroadcastObject(h, "typed", stateOf(h.Rank()), 0)
		}
		return nil
	})
	if errs[0] != nil || errs[1] != nil {
		t.Errorf("ranks 0 and 1 decode their own type: %v; %v", errs[0], errs[1])
	}
	if errs[2] == nil || !strings.Contains(errs[2].Error(), "decoding rank 0's object as horovod.other with gob") {
		t.Errorf("rank 2: %v", errs[2])
	}
	if _, err := BroadcastObject(hs[0], "", 1, 0); err == nil || !strings.Contains(err.Error(), "needs a name") {
		t.Errorf("no name: %v", err)
	}
	if _, err := BroadcastObject(hs[0], "x", 1, 3); err == nil || !strings.Contains(err.Error(), "root rank 3 outside 0..2") {
		t.Errorf("root 3: %v", err)
	}
	onEveryRank(t, hs, func(h *Horovod) error { return h.Barrier() })
}
