package horovod

import (
	"fmt"
	"sync"
	"testing"
)

// Every rank gets every rank's message: in one allgather while each fits its slot, in two when
// one does not (here rank 1's, of many specs).
func TestExchange(t *testing.T) {
	for _, long := range []int{0, 40} {
		g := newLoopback(3)
		msgs := make([]*message, 3)
		for r := range msgs {
			msgs[r] = &message{joined: r == 2, cached: []byte{byte(r + 1)}}
		}
		for i := range long {
			msgs[1].specs = append(msgs[1].specs, allreduceSpec(fmt.Sprintf("gradient/%d", i), i))
		}
		if n := len(msgs[1].encode(nil)); (n > slotSize-4) != (long > 0) {
			t.Fatalf("rank 1's message is %d bytes for a slot of %d", n, slotSize)
		}
		got := make([][]*message, 3)
		errs := make([]error, 3)
		var wg sync.WaitGroup
		for r := range 3 {
			wg.Go(func() { got[r], errs[r] = exchange(loopRank{g, r}.Allgatherv, r, 3, msgs[r]) })
		}
		wg.Wait()
		for r := range 3 {
			if errs[r] != nil {
				t.Fatalf("rank %d: %v", r, errs[r])
			}
			for from, m := range got[r] {
				if string(m.encode(nil)) != string(msgs[from].encode(nil)) {
					t.Errorf("%d specs: rank %d got rank %d's message as %+v", long, r, from, m)
				}
			}
		}
		want := int64(1)
		if long > 0 {
			want = 2
		}
		if n := g.calls["allgatherv"].Load(); n != want {
			t.Errorf("%d specs: %d allgathers, want %d", long, n, want)
		}
	}
}

func TestIdle(t *testing.T) {
	if !idle([]*message{{}, {}}) {
		t.Error("empty messages are not idle")
	}
	for _, m := range []*message{{shutdown: true}, {joined: true}, {cached: []byte{1}}, {groups: []cachedGroup{{}}}, {specs: []*spec{{}}}} {
		if idle([]*message{{}, m}) {
			t.Errorf("%+v is idle", m)
		}
	}
}
