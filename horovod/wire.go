package horovod

import (
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"slices"
)

// opKind is the collective a request asks for.
type opKind uint8

const (
	kindAllreduce opKind = iota + 1
	kindAllgather
	kindBroadcast
	kindBarrier
	kindReducescatter
	kindAlltoall
	kindProcessSet // adds a process set (AddProcessSet): the backend is split among its ranks
)

func (k opKind) String() string {
	switch k {
	case kindAllreduce:
		return "allreduce"
	case kindAllgather:
		return "allgather"
	case kindBroadcast:
		return "broadcast"
	case kindBarrier:
		return "barrier"
	case kindReducescatter:
		return "reducescatter"
	case kindAlltoall:
		return "alltoall"
	case kindProcessSet:
		return "process set"
	}
	return fmt.Sprintf("opKind(%d)", uint8(k))
}

// spec is what a rank says about one named operation during negotiation: everything that must
// agree across ranks before data moves (for allgather and alltoall, all but the first dimension).
type spec struct {
	name      string
	kind      opKind
	dtype     DType
	shape     []int
	op        ReduceOp
	prescale  float64
	postscale float64
	root      int
	group     string // "" outside a group (GroupedAllreduce and the like)
	groupSize int
	splits    []int // alltoall: the rows of the first dimension this rank sends to each rank
	members   []int // process set: its ranks, ascending
}

func (s *spec) equal(o *spec) bool {
	return s.sameSignature(o) && s.group == o.group && s.groupSize == o.groupSize
}

// sameSignature compares everything but the group: what the negotiation cache remembers, since
// a group gets a new group id on every call.
func (s *spec) sameSignature(o *spec) bool {
	return s.name == o.name && s.kind == o.kind && s.dtype == o.dtype && slices.Equal(s.shape, o.shape) &&
		s.op == o.op && s.prescale == o.prescale && s.postscale == o.postscale && s.root == o.root &&
		slices.Equal(s.splits, o.splits) && slices.Equal(s.members, o.members)
}

// agreedAsIs reports whether an operation's submissions (by rank, nil where a rank has not
// submitted) need no checking beyond equality: every one equals ref, a broadcast's root is among
// them, and the operation is no allgather or alltoall (whose responses carry every rank's first
// dimension or splits).
// It spares the steady state of a training loop, where every rank submits the same cached
// signatures round after round, from building a description of each rank's values.
func agreedAsIs(specs []*spec, ref *spec) bool {
	if ref.kind == kindAllgather || ref.kind == kindAlltoall || ref.kind == kindBroadcast && specs[ref.root] == nil ||
		ref.kind == kindProcessSet && slices.Contains(specs, nil) {
		return false
	}
	for _, s := range specs {
		if s != nil && s != ref && !s.equal(ref) {
			return false
		}
	}
	return true
}

// bytes is the size of the tensor the spec describes.
func (s *spec) bytes() int {
	n := s.dtype.Size()
	for _, d := range s.shape {
		n *= d
	}
	return n
}

// message is one rank's contribution to a negotiation round: the operations it submitted since
// the previous round, as references into the shared cache where the signature is already agreed
// (a bit per cache slot; members of a group by group) and in full otherwise.
type message struct {
	shutdown bool
	joined   bool
	cached   []byte // bitset over cache slots
	groups   []cachedGroup
	specs    []*spec
}

// cachedGroup is the cached members of one group.
type cachedGroup struct {
	group  string
	size   int
	cached []byte // bitset over cache slots
}

const (
	flagShutdown = 1 << iota
	flagJoined
)

func (m *message) encode(buf []byte) []byte {
	var flags uint64
	if m.shutdown {
		flags |= flagShutdown
	}
	if m.joined {
		flags |= flagJoined
	}
	buf = binary.AppendUvarint(buf, flags)
	buf = binary.AppendUvarint(buf, uint64(len(m.cached)))
	buf = append(buf, m.cached...)
	buf = binary.AppendUvarint(buf, uint64(len(m.groups)))
	for _, g := range m.groups {
		buf = appendString(buf, g.group)
		buf = binary.AppendUvarint(buf, uint64(g.size))
		buf = binary.AppendUvarint(buf, uint64(len(g.cached)))
		buf = append(buf, g.cached...)
	}
	buf = binary.AppendUvarint(buf, uint64(len(m.specs)))
	for _, s := range m.specs {
		buf = appendString(buf, s.name)
		buf = append(buf, byte(s.kind), byte(s.dtype), byte(s.op))
		buf = binary.AppendUvarint(buf, uint64(len(s.shape)))
		for _, d := range s.shape {
			buf = binary.AppendUvarint(buf, uint64(d))
		}
		buf = binary.LittleEndian.AppendUint64(buf, math.Float64bits(s.prescale))
		buf = binary.LittleEndian.AppendUint64(buf, math.Float64bits(s.postscale))
		buf = binary.AppendUvarint(buf, uint64(s.root))
		buf = appendString(buf, s.group)
		buf = binary.AppendUvarint(buf, uint64(s.groupSize))
		buf = appendInts(buf, s.splits)
		buf = appendInts(buf, s.members)
	}
	return buf
}

func appendInts(buf []byte, v []int) []byte {
	buf = binary.AppendUvarint(buf, uint64(len(v)))
	for _, n := range v {
		buf = binary.AppendUvarint(buf, uint64(n))
	}
	return buf
}

func appendString(buf []byte, s string) []byte {
	buf = binary.AppendUvarint(buf, uint64(len(s)))
	return append(buf, s...)
}

var errShortMessage = errors.New("truncated negotiation message")

// decoder reads what encode wrote; the first error sticks.
type decoder struct {
	b   []byte
	err error
}

func (d *decoder) uvarint() uint64 {
	if d.err != nil {
		return 0
	}
	v, n := binary.Uvarint(d.b)
	if n <= 0 {
		d.err = errShortMessage
		return 0
	}
	d.b = d.b[n:]
	return v
}

func (d *decoder) take(n uint64) []byte {
	if d.err != nil {
		return nil
	}
	if n > uint64(len(d.b)) {
		d.err = errShortMessage
		return nil
	}
	v := d.b[:n]
	d.b = d.b[n:]
	return v
}

func (d *decoder) float64() float64 {
	b := d.take(8)
	if b == nil {
		return 0
	}
	return math.Float64frombits(binary.LittleEndian.Uint64(b))
}

// ints reads what appendInts wrote: at most one value per rank of a job of size ranks.
func (d *decoder) ints(s *spec, what string, size int) []int {
	n := d.uvarint()
	if d.err == nil && n > uint64(size) {
		d.err = fmt.Errorf("%v %q: %d %s in a job of %d ranks", s.kind, s.name, n, what, size)
	}
	var v []int
	for j := uint64(0); j < n && d.err == nil; j++ {
		v = append(v, int(d.uvarint()))
	}
	return v
}

// decodeMessage reads a message from a rank of a job of size ranks. It refuses what no rank
// encodes: the controller trusts the specs it returns (it indexes the ranks by a broadcast's
// root, and sizes buffers by shapes), so a damaged message must fail the round, not panic it.
func decodeMessage(b []byte, size int) (*message, error) {
	d := &decoder{b: b}
	m := &message{}
	flags := d.uvarint()
	m.shutdown, m.joined = flags&flagShutdown != 0, flags&flagJoined != 0
	m.cached = d.take(d.uvarint())
	groups := d.uvarint()
	for i := uint64(0); i < groups && d.err == nil; i++ {
		g := cachedGroup{group: string(d.take(d.uvarint())), size: int(d.uvarint())}
		g.cached = d.take(d.uvarint())
		if d.err == nil && g.size < 0 {
			d.err = fmt.Errorf("group %q of %d members", g.group, uint64(g.size))
		}
		m.groups = append(m.groups, g)
	}
	n := d.uvarint()
	for i := uint64(0); i < n && d.err == nil; i++ {
		s := &spec{name: string(d.take(d.uvarint()))}
		k := d.take(3)
		if d.err != nil {
			break
		}
		s.kind, s.dtype, s.op = opKind(k[0]), DType(k[1]), ReduceOp(k[2])
		rank := d.uvarint()
		for j := uint64(0); j < rank && d.err == nil; j++ {
			s.shape = append(s.shape, int(d.uvarint()))
		}
		s.prescale = d.float64()
		s.postscale = d.float64()
		s.root = int(d.uvarint())
		s.group = string(d.take(d.uvarint()))
		s.groupSize = int(d.uvarint())
		s.splits = d.ints(s, "splits", size)
		s.members = d.ints(s, "members", size)
		if d.err == nil {
			d.err = s.check(size)
		}
		m.specs = append(m.specs, s)
	}
	if d.err == nil && len(d.b) != 0 {
		d.err = fmt.Errorf("%d stray bytes after a negotiation message", len(d.b))
	}
	return m, d.err
}

// check refuses a decoded spec that no rank of size ranks announces, naming its operation.
func (s *spec) check(size int) error {
	switch s.kind {
	case kindAllreduce, kindAllgather, kindBroadcast, kindReducescatter, kindAlltoall:
		if err := checkShape(s.dtype, s.shape); err != nil {
			return fmt.Errorf("%v %q: %w", s.kind, s.name, err)
		}
	case kindBarrier: // no tensor
	case kindProcessSet:
		if err := checkMembers(s.members, size); err != nil {
			return fmt.Errorf("%v %q: %w", s.kind, s.name, err)
		}
	default:
		return fmt.Errorf("%q: unknown operation %v", s.name, s.kind)
	}
	switch {
	case s.op > Adasum:
		return fmt.Errorf("%v %q: unknown reduce op %v", s.kind, s.name, s.op)
	case s.op == Adasum && (s.kind != kindAllreduce || !adasumFloats(s.dtype)):
		return fmt.Errorf("%v %q: Adasum of %v: an allreduce of a floating-point tensor only", s.kind, s.name, s.dtype)
	case s.root < 0 || s.root >= size:
		return fmt.Errorf("%v %q: root rank %d outside 0..%d", s.kind, s.name, uint64(s.root), size-1)
	case s.groupSize < 0:
		return fmt.Errorf("%v %q: group %q of %d members", s.kind, s.name, s.group, uint64(s.groupSize))
	case (s.kind == kindReducescatter || s.kind == kindAlltoall) && len(s.shape) == 0:
		return fmt.Errorf("%v %q: a scalar has no first dimension", s.kind, s.name)
	case s.kind == kindAlltoall:
		if err := checkSplits(s.splits, s.shape[0], size); err != nil {
			return fmt.Errorf("%v %q: %w", s.kind, s.name, err)
		}
	case len(s.splits) != 0:
		return fmt.Errorf("%v %q: splits are an alltoall's", s.kind, s.name)
	case len(s.members) != 0 && s.kind != kindProcessSet:
		return fmt.Errorf("%v %q: members are a process set's", s.kind, s.name)
	}
	return nil
}

// checkSplits checks an alltoall's splits of rows rows among size ranks: one per rank, none
// negative, summing to rows.
func checkSplits(splits []int, rows, size int) error {
	if len(splits) != size {
		return fmt.Errorf("%d splits for %d ranks", len(splits), size)
	}
	left := rows
	for r, n := range splits {
		if n < 0 || n > left {
			return fmt.Errorf("splits %v do not divide the first dimension %d among the ranks (at rank %d)", splits, rows, r)
		}
		left -= n
	}
	if left != 0 {
		return fmt.Errorf("splits %v sum to %d rows, not the first dimension %d", splits, rows-left, rows)
	}
	return nil
}

// checkMembers checks a process set's ranks in a job of size ranks: at least one, ascending
// (so distinct), each a rank of the job.
func checkMembers(ranks []int, size int) error {
	if len(ranks) == 0 {
		return errors.New("a process set needs at least one rank")
	}
	for i, r := range ranks {
		if r < 0 || r >= size {
			return fmt.Errorf("ranks %v: %d is not a rank of a job of %d", ranks, r, size)
		}
		if i > 0 && r <= ranks[i-1] {
			return fmt.Errorf("ranks %v are not in ascending order without repeats", ranks)
		}
	}
	return nil
}

func setBit(b []byte, i int) []byte {
	for len(b) <= i/8 {
		b = append(b, 0)
	}
	b[i/8] |= 1 << (i % 8)
	return b
}

// bits yields the indices of the set bits of b, in increasing order.
func bits(b []byte) func(func(int) bool) {
	return func(yield func(int) bool) {
		for i, x := range b {
			for j := 0; j < 8; j++ {
				if x&(1<<j) != 0 && !yield(i*8+j) {
					return
				}
			}
		}
	}
}
