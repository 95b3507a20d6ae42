package horovod

import (
	"slices"
	"time"
)

// entry is an operation some rank has announced and not every rank has yet.
type entry struct {
	specs     []*spec // by rank; nil: not announced yet
	firstSeen time.Time
	// busyAtFirstSeen is the controller's busyTotal at firstSeen (see stallAge).
	busyAtFirstSeen time.Duration
}

// messageTable is the negotiation table (Horovod's message table): the operations some rank has
// announced and not every rank has, in the order they first appeared, and the ranks that have
// joined. It is identical on every rank because every rank applies the same messages in the same
// order.
type messageTable struct {
	size     int
	entries  map[string]*entry
	order    []string // the entries' names in the order they first appeared
	joinedAt []int    // cycle at which each rank joined; -1 if it has not
	cycle    int      // negotiation rounds applied
}

func newMessageTable(size int) *messageTable {
	return &messageTable{size: size, entries: map[string]*entry{}, joinedAt: slices.Repeat([]int{-1}, size)}
}

// add records rank r's announcement of s and reports whether s is new to the table; a new entry
// is stamped with now and busy, the time the loop has spent in backend calls so far.
func (t *messageTable) add(r int, s *spec, now time.Time, busy time.Duration) (first bool) {
	e := t.entries[s.name]
	if e == nil {
		e = &entry{specs: make([]*spec, t.size), firstSeen: now, busyAtFirstSeen: busy}
		t.entries[s.name] = e
		t.order = append(t.order, s.name)
		first = true
	}
	e.specs[r] = s
	return first
}

// settle removes the operations a round answered; remaining, the others in their order, becomes
// the order.
func (t *messageTable) settle(answered []*response, remaining []string) {
	for _, resp := range answered {
		delete(t.entries, resp.spec.name)
	}
	t.order = remaining
}

// join records that rank r has joined, in the current cycle unless it already had.
func (t *messageTable) join(r int) {
	if t.joinedAt[r] < 0 {
		t.joinedAt[r] = t.cycle
	}
}

// joined reports whether rank r has joined.
func (t *messageTable) joined(r int) bool { return t.joinedAt[r] >= 0 }

// lastJoined returns the rank that joined last (the highest of those that joined in the last
// cycle) once every rank has joined, and starts the next join; -1 while some rank has not.
func (t *messageTable) lastJoined() int {
	for r := range t.joinedAt {
		if !t.joined(r) {
			return -1
		}
	}
	last, latest := -1, -1
	for r, at := range t.joinedAt {
		if at >= latest {
			latest, last = at, r
		}
		t.joinedAt[r] = -1
	}
	return last
}
