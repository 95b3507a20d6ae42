package horovod

import (
	"encoding/binary"
	"fmt"
	"slices"
)

// slotSize is the fixed per-rank slot of the first negotiation allgather: a length and the start
// of the message. A steady-state message (cache bits only) fits, so a round is one collective;
// longer messages send their remainder in a second allgather.
const slotSize = 256

// exchange gives every rank every rank's message, by rank, over allgatherv (the control
// backend's): rank is this rank of size.
func exchange(allgatherv func(send, recv []byte, counts []int) error, rank, size int, m *message) ([]*message, error) {
	enc := m.encode(nil)
	own := make([]byte, slotSize)
	binary.LittleEndian.PutUint32(own, uint32(len(enc)))
	copy(own[4:], enc)
	slots := make([]byte, slotSize*size)
	if err := allgatherv(own, slots, slices.Repeat([]int{slotSize}, size)); err != nil {
		return nil, err
	}
	lens := make([]int, size)
	rest := make([]int, size) // bytes beyond each rank's slot
	total := 0
	for r := range lens {
		lens[r] = int(binary.LittleEndian.Uint32(slots[r*slotSize:]))
		rest[r] = max(0, lens[r]-(slotSize-4))
		total += rest[r]
	}
	var tail []byte
	if total > 0 {
		tail = make([]byte, total)
		if err := allgatherv(enc[len(enc)-rest[rank]:], tail, rest); err != nil {
			return nil, err
		}
	}
	msgs := make([]*message, size)
	for r, n := range lens {
		body := append(slots[r*slotSize+4:r*slotSize+4+n-rest[r]:r*slotSize+4+n-rest[r]], tail[:rest[r]]...)
		tail = tail[rest[r]:]
		msg, err := decodeMessage(body, size)
		if err != nil {
			return nil, fmt.Errorf("message from rank %d: %w", r, err)
		}
		msgs[r] = msg
	}
	return msgs, nil
}

// idle reports whether a round carried nothing from any rank.
func idle(msgs []*message) bool {
	for _, m := range msgs {
		if m.shutdown || m.joined || len(m.cached) > 0 || len(m.groups) > 0 || len(m.specs) > 0 {
			return false
		}
	}
	return true
}
