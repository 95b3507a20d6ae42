package horovod

import (
	"bytes"
	"testing"
)

// FuzzDecodeMessage: any bytes a peer sends are a message or an error, never a panic; a message
// encodes to bytes that decode to the same message; and a round of messages of that kind, one
// from every rank and then again from the cache it filled, is answered or refused by the
// controller without a panic.
func FuzzDecodeMessage(f *testing.F) {
	const size = 3
	grouped := allreduceSpec("grouped/a", 4)
	grouped.group, grouped.groupSize = "group.1", 2
	for _, m := range []*message{
		{},
		{shutdown: true, joined: true},
		{cached: []byte{0b101}, groups: []cachedGroup{{group: "group.3", size: 2, cached: []byte{0, 1}}}},
		{specs: []*spec{
			allreduceSpec("gradient/0", 8),
			grouped,
			{name: "broadcast/w", kind: kindBroadcast, dtype: Float32, shape: []int{2, 3}, root: size - 1},
			{name: "gather", kind: kindAllgather, dtype: Int64, shape: []int{5, 2}},
			{name: "scatter", kind: kindReducescatter, dtype: Float16, shape: []int{4, 3}, op: Max, prescale: 1, postscale: 2},
			{name: "adasum", kind: kindAllreduce, dtype: BFloat16, shape: []int{7}, op: Adasum, prescale: 1, postscale: 1},
			{name: "a2a", kind: kindAlltoall, dtype: Uint8, shape: []int{6, 2}, splits: []int{1, 0, 5}},
			{name: "barrier", kind: kindBarrier},
			{name: "horovod.process_set", kind: kindProcessSet, members: []int{0, size - 1}},
		}},
	} {
		f.Add(m.encode(nil))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		m, err := decodeMessage(b, size)
		if err != nil {
			return
		}
		enc := m.encode(nil)
		again, err := decodeMessage(enc, size)
		if err != nil {
			t.Fatalf("%+v encodes to a message that does not decode: %v", m, err)
		}
		// Compared encoded: a NaN scale factor is no DeepEqual of itself.
		if !bytes.Equal(again.encode(nil), enc) {
			t.Fatalf("%+v encodes to a message that decodes as %+v", m, again)
		}
		c := &controller{
			h: &Horovod{}, size: size, table: newMessageTable(size), cache: newResponseCache(DefaultCacheCapacity),
			failedGroups: map[string]*groupFailure{},
		}
		for range 2 {
			if _, _, _, err := c.process([]*message{m, m, m}); err != nil {
				return
			}
		}
	})
}
