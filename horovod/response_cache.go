package horovod

import "fmt"

// responseCache remembers the signatures of agreed operations (Horovod's ResponseCache), so that
// a later round announces an operation submitted again with the same signature by its slot, one
// bit, instead of its whole spec. Every rank remembers the same responses in the same order, so
// the caches of all ranks are the same and a slot means the same operation on every rank.
type responseCache struct {
	capacity int     // slots at most; 0 disables the cache
	specs    []*spec // by slot
	slots    map[string]int
}

func newResponseCache(capacity int) *responseCache {
	return &responseCache{capacity: capacity, slots: map[string]int{}}
}

// slot returns the slot that holds s's signature (its group aside), if one does.
func (rc *responseCache) slot(s *spec) (int, bool) {
	id, ok := rc.slots[s.name]
	if !ok || !rc.specs[id].sameSignature(s) {
		return 0, false
	}
	return id, true
}

// spec returns a copy of slot id's spec as a member of group (of size members; "" and 0 outside
// a group). A slot past the end means the ranks' caches differ: a protocol error.
func (rc *responseCache) spec(id int, group string, size int) (*spec, error) {
	if id >= len(rc.specs) {
		return nil, fmt.Errorf("negotiation cache slot %d of %d: ranks disagree about the cache", id, len(rc.specs))
	}
	s := *rc.specs[id]
	s.group, s.groupSize = group, size
	return &s, nil
}

// remember caches an agreed signature: in the slot of its name if it has one, else in a new
// slot while there is room. An allgather or alltoall is never cached: each rank's first
// dimension (and splits) differ, so there is no shared signature to refer to.
func (rc *responseCache) remember(s *spec) {
	if s.kind == kindAllgather || s.kind == kindAlltoall {
		return
	}
	if id, ok := rc.slots[s.name]; ok {
		rc.specs[id] = s
		return
	}
	if len(rc.specs) < rc.capacity {
		rc.slots[s.name] = len(rc.specs)
		rc.specs = append(rc.specs, s)
	}
}
