package horovod

import (
	"encoding/binary"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/gorovod/gorovod/horovod/backend"
)

// request is one operation submitted on this rank, from submission until its result is delivered.
type request struct {
	spec
	input  []byte
	output []byte // where the result goes; nil: allocated at execution
	result Tensor
	err    error
	done   chan struct{}
}

func (r *request) complete(t Tensor, err error) {
	r.result, r.err = t, err
	close(r.done)
}

// entry is an operation some rank has submitted and not every rank has yet: the negotiation table,
// identical on every rank because every rank applies the same messages in the same order.
type entry struct {
	specs     []*spec // by rank; nil: not submitted yet
	firstSeen time.Time
	// busyAtFirstSeen is the controller's busyTotal at firstSeen (see stallAge).
	busyAtFirstSeen time.Duration
}

// response is an operation every rank has submitted (or an error about one), in the order every
// rank executes them.
type response struct {
	spec      *spec  // as agreed (rank-independent fields); for allgather, of the lowest submitting rank
	firstDims []int  // allgather: each rank's first dimension (0 for a joined rank)
	err       *Error // non-nil: the operation fails on every rank with this error
	ready     time.Time
}

// controller is the background loop of one process and the state it negotiates.
type controller struct {
	h             *Horovod
	control, data backend.Backend
	rank, size    int

	mu       sync.Mutex
	queue    []*request          // submitted, not yet announced
	inflight map[string]*request // submitted, not yet completed (names are unique in flight)
	// executing holds the requests taken out of inflight for the collective in progress (loop
	// goroutine only): when it fails they fail with it, since stop reaches only inflight and a
	// caller waiting on a dropped request would wait forever (and Shutdown with it).
	executing     []*request
	stopErr       error // non-nil once the loop has ended: why
	shutdownAsked bool
	joinAsked     bool
	joinResult    chan int
	wake          chan struct{}
	stopped       chan struct{}
	// closing is held for reading by callers that touch memory the data backend lent (a
	// Reducer's arenas) and for writing while Shutdown closes the backends, which frees it.
	closing sync.RWMutex

	// Owned by the loop goroutine; the first four are identical on every rank.
	table      map[string]*entry
	order      []string // table's names in the order they first appeared
	cache      []*spec  // agreed signatures; a message refers to them by index
	cacheIndex map[string]int
	joinedAt   []int // cycle at which each rank joined; -1 if it has not
	cycle      int
	lastWarn   time.Time
	fusion     arena // in the data backend's memory when it lends some (backend.HostAllocator)
	timeline   *timeline

	busySince atomic.Int64  // unix ns when the current backend call began; 0 when none
	busyWhat  atomic.Value  // string: that call
	busyTotal time.Duration // time spent in backend calls so far (loop goroutine only)
}

func newController(h *Horovod, control, data backend.Backend) (*controller, error) {
	t := control.Topology()
	c := &controller{
		h: h, control: control, data: data, rank: t.Rank, size: t.Size,
		inflight:   map[string]*request{},
		wake:       make(chan struct{}, 1),
		stopped:    make(chan struct{}),
		table:      map[string]*entry{},
		cacheIndex: map[string]int{},
		joinedAt:   slices.Repeat([]int{-1}, t.Size),
	}
	c.fusion = h.hostArena(data)
	if h.cfg.Timeline != "" && t.Rank == 0 {
		tl, err := newTimeline(h.cfg.Timeline)
		if err != nil {
			return nil, err
		}
		c.timeline = tl
	}
	return c, nil
}

// start runs the background loop and its watchdog; Init calls it once every rank is set up.
func (c *controller) start() {
	if p, ok := c.control.(backend.Pinned); ok {
		go p.Serve(c.loop) // MPI: the loop runs on the MPI thread itself
	} else {
		go c.loop()
	}
	go c.watchdog()
}

// submit queues reqs atomically (one negotiation round sees all of them, so they can fuse).
func (c *controller) submit(reqs ...*request) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.stopErr != nil {
		return c.stopErr
	}
	if c.joinAsked {
		return fmt.Errorf("horovod: rank %d has called Join: it submits no more operations until every rank has joined", c.rank)
	}
	seen := map[string]bool{}
	for _, r := range reqs {
		if c.inflight[r.name] != nil || seen[r.name] {
			return &Error{Op: r.kind.String(), Tensor: r.name, Reason: fmt.Sprintf("duplicate name: an operation of that name is already in flight on rank %d (names must be unique among outstanding operations)", c.rank)}
		}
		seen[r.name] = true
	}
	for _, r := range reqs {
		r.done = make(chan struct{})
		c.inflight[r.name] = r
	}
	c.queue = append(c.queue, reqs...)
	c.poke()
	return nil
}

func (c *controller) poke() {
	select {
	case c.wake <- struct{}{}:
	default:
	}
}

func (c *controller) shutdown() error {
	c.mu.Lock()
	c.shutdownAsked = true
	c.mu.Unlock()
	c.poke()
	<-c.stopped
	c.closing.Lock() // waits for a Reducer step on lent memory to return (the loop has failed it)
	defer c.closing.Unlock()
	var errs []string
	if c.data != c.control {
		if err := c.data.Close(); err != nil {
			errs = append(errs, err.Error())
		}
	}
	if err := c.control.Close(); err != nil {
		errs = append(errs, err.Error())
	}
	if err := c.timeline.close(); err != nil {
		errs = append(errs, err.Error())
	}
	if errs != nil {
		return fmt.Errorf("horovod: shutdown: %s", strings.Join(errs, "; "))
	}
	return nil
}

// hold keeps Shutdown from closing the backends, and so from freeing the memory the data
// backend lent, until release is called. It fails with the error every later operation gets
// (ErrShutdown after Shutdown) once the loop has stopped: that memory is then freed, or is about
// to be, and must not be touched.
func (c *controller) hold() (release func(), err error) {
	c.closing.RLock()
	c.mu.Lock()
	err = c.stopErr
	c.mu.Unlock()
	if err != nil {
		c.closing.RUnlock()
		return nil, err
	}
	return c.closing.RUnlock, nil
}

// join announces that this rank has no more data and waits until every rank has; it returns the
// rank that joined last.
func (c *controller) join() (int, error) {
	c.mu.Lock()
	if c.stopErr != nil {
		c.mu.Unlock()
		return 0, c.stopErr
	}
	if c.joinAsked {
		c.mu.Unlock()
		return 0, fmt.Errorf("horovod: Join called twice concurrently on rank %d", c.rank)
	}
	c.joinAsked = true
	res := make(chan int, 1)
	c.joinResult = res
	c.mu.Unlock()
	c.poke()
	select {
	case last := <-res:
		return last, nil
	case <-c.stopped:
		c.mu.Lock()
		defer c.mu.Unlock()
		return 0, c.stopErr
	}
}

// loop is the background loop: wait for work or the cycle time, negotiate, execute, repeat.
func (c *controller) loop() {
	defer close(c.stopped)
	wait := c.h.cfg.CycleTime
	timer := time.NewTimer(wait)
	defer timer.Stop()
	for {
		select {
		case <-c.wake:
		case <-timer.C:
		}
		c.mu.Lock()
		out := &message{shutdown: c.shutdownAsked, joined: c.joinAsked}
		reqs := c.queue
		c.queue = nil
		c.mu.Unlock()
		groups := map[string]int{} // group -> index in out.groups
		for _, r := range reqs {
			id, ok := c.cacheIndex[r.name]
			switch {
			case !ok || !c.cache[id].sameSignature(&r.spec):
				out.specs = append(out.specs, &r.spec)
			case r.group == "":
				out.cached = setBit(out.cached, id)
			default:
				i, seen := groups[r.group]
				if !seen {
					i = len(out.groups)
					groups[r.group] = i
					out.groups = append(out.groups, cachedGroup{group: r.group, size: r.groupSize})
				}
				out.groups[i].cached = setBit(out.groups[i].cached, id)
			}
		}
		msgs, err := c.exchange(out)
		if err != nil {
			c.fail(fmt.Errorf("horovod: negotiation failed on rank %d: %w", c.rank, err))
			return
		}
		responses, stopBy, lastJoined, err := c.process(msgs)
		if err != nil {
			c.fail(fmt.Errorf("horovod: rank %d: %w", c.rank, err))
			return
		}
		if err := c.execute(responses); err != nil {
			c.fail(err)
			return
		}
		if lastJoined >= 0 {
			c.mu.Lock()
			if c.joinAsked {
				c.joinAsked = false
				c.joinResult <- lastJoined
			}
			c.mu.Unlock()
		}
		if stopBy >= 0 {
			c.stop(fmt.Errorf("%w (Shutdown called on rank %d)", ErrShutdown, stopBy))
			return
		}
		c.timeline.flushIfDue()
		// While no rank has anything to negotiate, idle rounds back off to 16 cycle times: a
		// round costs a collective, in which MPI polls. A submission still starts a round at once.
		if idle(msgs) && len(c.order) == 0 {
			wait = min(2*wait, maxIdleCycles*c.h.cfg.CycleTime)
		} else {
			wait = c.h.cfg.CycleTime
		}
		timer.Reset(wait)
	}
}

const maxIdleCycles = 16

// idle reports whether a round carried nothing from any rank.
func idle(msgs []*message) bool {
	for _, m := range msgs {
		if m.shutdown || m.joined || len(m.cached) > 0 || len(m.groups) > 0 || len(m.specs) > 0 {
			return false
		}
	}
	return true
}

// fail ends the loop after a backend or protocol failure, and the job with it: the other ranks
// cannot complete a collective without this one, and would otherwise wait forever.
func (c *controller) fail(err error) {
	c.h.log.Printf("%v: aborting the job, since the other ranks cannot go on without this one", err)
	c.stop(err)
	c.control.Abort(1)
}

// stop ends the loop: every operation still waiting on this rank fails with err.
func (c *controller) stop(err error) {
	c.mu.Lock()
	c.stopErr = err
	pending := c.inflight
	c.inflight = map[string]*request{}
	c.queue = nil
	c.mu.Unlock()
	for _, r := range pending {
		r.complete(Tensor{}, err)
	}
}

// slotSize is the fixed per-rank slot of the first negotiation allgather: a length and the start
// of the message. A steady-state message (cache bits only) fits, so a round is one collective;
// longer messages send their remainder in a second allgather.
const slotSize = 256

// exchange gives every rank every rank's message.
func (c *controller) exchange(m *message) ([]*message, error) {
	enc := m.encode(nil)
	own := make([]byte, slotSize)
	binary.LittleEndian.PutUint32(own, uint32(len(enc)))
	copy(own[4:], enc)
	slots := make([]byte, slotSize*c.size)
	if err := c.busy(negotiationRound, func() error {
		return c.control.Allgatherv(own, slots, slices.Repeat([]int{slotSize}, c.size))
	}); err != nil {
		return nil, err
	}
	lens := make([]int, c.size)
	rest := make([]int, c.size) // bytes beyond each rank's slot
	total := 0
	for r := range lens {
		lens[r] = int(binary.LittleEndian.Uint32(slots[r*slotSize:]))
		rest[r] = max(0, lens[r]-(slotSize-4))
		total += rest[r]
	}
	var tail []byte
	if total > 0 {
		tail = make([]byte, total)
		if err := c.busy(negotiationRound, func() error {
			return c.control.Allgatherv(enc[len(enc)-rest[c.rank]:], tail, rest)
		}); err != nil {
			return nil, err
		}
	}
	msgs := make([]*message, c.size)
	for r, n := range lens {
		body := append(slots[r*slotSize+4:r*slotSize+4+n-rest[r]:r*slotSize+4+n-rest[r]], tail[:rest[r]]...)
		tail = tail[rest[r]:]
		msg, err := decodeMessage(body)
		if err != nil {
			return nil, fmt.Errorf("message from rank %d: %w", r, err)
		}
		msgs[r] = msg
	}
	return msgs, nil
}

// negotiationRound is what the watchdog calls a blocked negotiation allgather.
const negotiationRound = "negotiation allgather"

// busy runs one backend call under the watchdog's eye.
func (c *controller) busy(what string, f func() error) error {
	start := time.Now()
	c.busyWhat.Store(what)
	c.busySince.Store(start.UnixNano())
	defer func() {
		c.busySince.Store(0)
		c.busyTotal += time.Since(start)
	}()
	return f()
}

// process applies every rank's message to the table and returns, in the same order on every rank,
// the operations that are now ready or failed. stopBy is the lowest rank that asked to shut down
// (-1 if none); lastJoined is the rank that joined last once all have (-1 otherwise).
func (c *controller) process(msgs []*message) (responses []*response, stopBy, lastJoined int, err error) {
	now := time.Now()
	stopBy, lastJoined = -1, -1
	for r, m := range msgs {
		if m.shutdown && stopBy < 0 {
			stopBy = r
		}
		if m.joined && c.joinedAt[r] < 0 {
			c.joinedAt[r] = c.cycle
		}
		for id := range bits(m.cached) {
			if id >= len(c.cache) {
				return nil, 0, 0, fmt.Errorf("rank %d refers to negotiation cache slot %d of %d: ranks disagree about the cache", r, id, len(c.cache))
			}
			s := *c.cache[id]
			s.group, s.groupSize = "", 0
			c.add(r, &s, now)
		}
		for _, g := range m.groups {
			for id := range bits(g.cached) {
				if id >= len(c.cache) {
					return nil, 0, 0, fmt.Errorf("rank %d refers to negotiation cache slot %d of %d: ranks disagree about the cache", r, id, len(c.cache))
				}
				s := *c.cache[id]
				s.group, s.groupSize = g.group, g.size
				c.add(r, &s, now)
			}
		}
		for _, s := range m.specs {
			c.add(r, s, now)
		}
	}
	c.cycle++

	// A group is ready when every rank that has not joined has submitted as many members as the
	// group has.
	groupCount := map[string][]int{}
	for _, name := range c.order {
		for r, s := range c.table[name].specs {
			if s != nil && s.group != "" {
				if groupCount[s.group] == nil {
					groupCount[s.group] = make([]int, c.size)
				}
				groupCount[s.group][r]++
			}
		}
	}
	groupReady := func(g string, size int) bool {
		for r, n := range groupCount[g] {
			if c.joinedAt[r] < 0 && n != size {
				return false
			}
		}
		return true
	}

	groupErr := map[string]string{}
	var remaining []string
	for _, name := range c.order {
		e := c.table[name]
		ready := true
		group, groupSize := "", 0
		groupsDiffer := false // some rank grouped it, another did not: agree reports it
		var first *spec
		for r, s := range e.specs {
			if s == nil {
				ready = ready && c.joinedAt[r] >= 0
				continue
			}
			if first == nil {
				first = s
			}
			groupsDiffer = groupsDiffer || s.group != first.group
			if s.group != "" {
				group, groupSize = s.group, s.groupSize
			}
		}
		if group != "" && !(ready && groupsDiffer) {
			// A group moves as a whole: once every rank has submitted its members, either all of
			// them are complete, or the ranks grouped different tensors and every member fails.
			if !groupReady(group, groupSize) {
				ready = false
			} else {
				if _, ok := groupErr[group]; !ok {
					groupErr[group] = c.checkGroup(group)
				}
				ready = ready || groupErr[group] != ""
			}
		}
		if !ready {
			remaining = append(remaining, name)
			continue
		}
		resp := c.agree(name, e)
		if resp.err == nil && group != "" && groupErr[group] != "" {
			resp.err = &Error{Op: "allreduce", Tensor: name, Reason: groupErr[group]}
		}
		resp.ready = now
		responses = append(responses, resp)
		c.timeline.negotiated(name, resp.spec.kind, now)
		if resp.err == nil {
			c.remember(resp.spec)
		}
	}
	for _, resp := range responses {
		delete(c.table, resp.spec.name)
	}
	c.order = remaining
	c.inspectStalls(now)

	allJoined := true
	for r := range c.joinedAt {
		if c.joinedAt[r] < 0 {
			allJoined = false
		}
	}
	if allJoined {
		latest := -1
		for r, at := range c.joinedAt {
			if at >= latest {
				latest, lastJoined = at, r
			}
			c.joinedAt[r] = -1
		}
	}
	return responses, stopBy, lastJoined, nil
}

func (c *controller) add(r int, s *spec, now time.Time) {
	e := c.table[s.name]
	if e == nil {
		e = &entry{specs: make([]*spec, c.size), firstSeen: now, busyAtFirstSeen: c.busyTotal}
		c.table[s.name] = e
		c.order = append(c.order, s.name)
		c.timeline.submitted(s.name, s.kind, now)
	}
	e.specs[r] = s
	c.timeline.arrived(s.name, r, now)
}

// remember caches an agreed signature so that later rounds refer to it by slot.
func (c *controller) remember(s *spec) {
	if s.kind == kindAllgather { // each rank's first dimension differs: nothing to share
		return
	}
	if id, ok := c.cacheIndex[s.name]; ok {
		c.cache[id] = s
		return
	}
	if len(c.cache) < c.h.cfg.CacheCapacity {
		c.cacheIndex[s.name] = len(c.cache)
		c.cache = append(c.cache, s)
	}
}

// checkGroup verifies that every rank put the same tensors in group g; it returns "" when they
// did, and otherwise a description of each rank's members.
func (c *controller) checkGroup(g string) string {
	members := make([][]string, c.size)
	consistent := true
	for _, name := range c.order {
		e := c.table[name]
		for r, s := range e.specs {
			if s != nil && s.group == g {
				members[r] = append(members[r], name)
			} else if s == nil && c.joinedAt[r] < 0 {
				consistent = consistent && !inGroup(e, g)
			}
		}
	}
	if consistent {
		return ""
	}
	var parts []string
	for r, m := range members {
		if c.joinedAt[r] < 0 {
			parts = append(parts, fmt.Sprintf("rank %d: %v", r, m))
		}
	}
	return fmt.Sprintf("ranks grouped different tensors in %s: %s", g, strings.Join(parts, "; "))
}

func inGroup(e *entry, g string) bool {
	for _, s := range e.specs {
		if s != nil && s.group == g {
			return true
		}
	}
	return false
}

// agree checks that every rank's spec for one operation match and builds its response.
func (c *controller) agree(name string, e *entry) *response {
	var ref *spec
	for _, s := range e.specs {
		if s != nil {
			ref = s
			break
		}
	}
	resp := &response{spec: ref}
	fail := func(what string, key func(*spec) string) bool {
		vals := make([]string, c.size)
		differ := false
		for r, s := range e.specs {
			if s != nil {
				vals[r] = key(s)
				differ = differ || vals[r] != key(ref)
			}
		}
		if differ {
			resp.err = &Error{Op: ref.kind.String(), Tensor: name, Reason: "mismatched " + what + ": " + describeByRank(vals)}
		}
		return differ
	}
	shapeKey := func(s *spec) string { return fmt.Sprint(s.shape) }
	if fail("operations", func(s *spec) string { return s.kind.String() }) ||
		fail("data types", func(s *spec) string { return s.dtype.String() }) {
		return resp
	}
	switch ref.kind {
	case kindAllreduce:
		_ = fail("shapes", shapeKey) ||
			fail("reduce ops", func(s *spec) string { return s.op.String() }) ||
			fail("prescale factors", func(s *spec) string { return strconv.FormatFloat(s.prescale, 'g', -1, 64) }) ||
			fail("postscale factors", func(s *spec) string { return strconv.FormatFloat(s.postscale, 'g', -1, 64) }) ||
			fail("groups", func(s *spec) string {
				if s.group == "" {
					return "no group"
				}
				return s.group
			})
	case kindBroadcast:
		if !fail("shapes", shapeKey) && !fail("root ranks", func(s *spec) string { return strconv.Itoa(s.root) }) {
			if e.specs[ref.root] == nil {
				resp.err = &Error{Op: "broadcast", Tensor: name, Reason: fmt.Sprintf("root rank %d has joined", ref.root)}
			}
		}
	case kindAllgather:
		if len(ref.shape) == 0 {
			resp.err = &Error{Op: "allgather", Tensor: name, Reason: "a scalar has no first dimension to gather along"}
			return resp
		}
		if fail("shapes beyond the first dimension", func(s *spec) string {
			if len(s.shape) == 0 {
				return "scalar"
			}
			return fmt.Sprint(s.shape[1:])
		}) {
			return resp
		}
		resp.firstDims = make([]int, c.size)
		for r, s := range e.specs {
			if s != nil {
				resp.firstDims[r] = s.shape[0]
			}
		}
	}
	return resp
}

// describeByRank renders per-rank values as "A on ranks 0,2; B on rank 1" (empty values skipped).
func describeByRank(vals []string) string {
	var order []string
	ranks := map[string][]string{}
	for r, v := range vals {
		if v == "" {
			continue
		}
		if ranks[v] == nil {
			order = append(order, v)
		}
		ranks[v] = append(ranks[v], strconv.Itoa(r))
	}
	parts := make([]string, len(order))
	for i, v := range order {
		word := "rank"
		if len(ranks[v]) > 1 {
			word = "ranks"
		}
		parts[i] = fmt.Sprintf("%s on %s %s", v, word, strings.Join(ranks[v], ","))
	}
	return strings.Join(parts, "; ")
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
