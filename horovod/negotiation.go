package horovod

import (
	"fmt"
	"math"
	"slices"
	"strconv"
	"strings"
	"time"
)

// response is an operation every rank has submitted (or an error about one), in the order every
// rank executes them.
type response struct {
	spec      *spec   // as agreed (rank-independent fields); for allgather, of the lowest submitting rank
	firstDims []int   // allgather: each rank's first dimension (0 for a joined rank)
	splits    [][]int // alltoall: each rank's splits (the rows it sends to each rank)
	err       *Error  // non-nil: the operation fails on every rank with this error
	ready     time.Time
}

// announce is this rank's message for a round: its shutdown and join requests and the requests
// submitted since the last round, each by its cache slot where the cache holds its signature
// (by group for the members of a group, whose group changes from call to call) and in
// full otherwise.
func announce(cache *responseCache, reqs []*request, shutdown, joined bool) *message {
	m := &message{shutdown: shutdown, joined: joined}
	groups := map[string]int{} // group -> index in m.groups
	for _, r := range reqs {
		id, ok := cache.slot(&r.spec)
		switch {
		case !ok:
			m.specs = append(m.specs, &r.spec)
		case r.group == "":
			m.cached = setBit(m.cached, id)
		default:
			i, seen := groups[r.group]
			if !seen {
				i = len(m.groups)
				groups[r.group] = i
				m.groups = append(m.groups, cachedGroup{group: r.group, size: r.groupSize})
			}
			m.groups[i].cached = setBit(m.groups[i].cached, id)
		}
	}
	return m
}

// process applies every rank's message to the table and returns, in the same order on every rank,
// the operations that are now ready or failed. stopBy is the lowest rank that asked to shut down
// (-1 if none); lastJoined is the rank that joined last once all have (-1 otherwise).
func (c *controller) process(msgs []*message) (responses []*response, stopBy, lastJoined int, err error) {
	now := time.Now()
	if stopBy, err = c.apply(msgs, now); err != nil {
		return nil, 0, 0, err
	}
	responses = c.answer(now)
	c.inspectStalls(now)
	return responses, stopBy, c.table.lastJoined(), nil
}

// apply enters every rank's message into the table, as one negotiation cycle, and returns the
// lowest rank that asked to shut down (-1 if none).
func (c *controller) apply(msgs []*message, now time.Time) (stopBy int, err error) {
	stopBy = -1
	for r, m := range msgs {
		if m.shutdown && stopBy < 0 {
			stopBy = r
		}
		if m.joined {
			c.table.join(r)
		}
		for id := range bits(m.cached) {
			if err := c.addCached(r, id, "", 0, now); err != nil {
				return 0, err
			}
		}
		for _, g := range m.groups {
			for id := range bits(g.cached) {
				if err := c.addCached(r, id, g.group, g.size, now); err != nil {
					return 0, err
				}
			}
		}
		for _, s := range m.specs {
			c.add(r, s, now)
		}
	}
	c.table.cycle++
	return stopBy, nil
}

func (c *controller) addCached(r, id int, group string, size int, now time.Time) error {
	s, err := c.cache.spec(id, group, size)
	if err != nil {
		return fmt.Errorf("rank %d refers to %w", r, err)
	}
	c.add(r, s, now)
	return nil
}

func (c *controller) add(r int, s *spec, now time.Time) {
	if c.table.add(r, s, now, c.busyTotal) {
		c.timeline.submitted(s.name, s.kind, now)
	}
	c.timeline.arrived(s.name, r, now)
}

// answer takes out of the table, in table order, the operations every rank has now submitted
// (a rank that has joined counts as having submitted), checked and cached, and the grouped
// allreduces that fail as a group.
func (c *controller) answer(now time.Time) []*response {
	groups := newGroupTable(c.table)
	var responses []*response
	var respGroups [][]string // each response's groups, as the ranks named them
	var remaining []string
	for _, name := range c.table.order {
		e := c.table.entries[name]
		ready := true
		group := ""
		groupsDiffer := false // some rank grouped it, another did not: agree reports it
		var first *spec
		var named []string
		for r, s := range e.specs {
			if s == nil {
				ready = ready && c.table.joined(r)
				continue
			}
			if first == nil {
				first = s
			}
			groupsDiffer = groupsDiffer || s.group != first.group
			if s.group != "" {
				group = s.group
				if !slices.Contains(named, s.group) {
					named = append(named, s.group)
				}
			}
		}
		failed := c.failedGroup(named)
		if group != "" && failed == nil && !(ready && groupsDiffer) {
			// A group moves as a whole: once every rank has submitted its members, either all of
			// them are complete, or the ranks grouped different tensors and every member fails.
			if !groups.complete(group) {
				ready = false
			} else {
				ready = ready || groups.mismatch(group) != ""
			}
		}
		if !ready {
			remaining = append(remaining, name)
			continue
		}
		resp := agree(name, e, c.size) // a failed group's members fail below, with this round's
		if resp.err == nil && failed == nil && group != "" {
			if why := groups.mismatch(group); why != "" {
				resp.err = &Error{Op: "allreduce", Tensor: name, Reason: why}
			}
		}
		resp.ready = now
		responses = append(responses, resp)
		respGroups = append(respGroups, named)
	}
	// A member that failed fails its groups: their members answered in this round fail with
	// it, and those still to come fail when every rank has submitted them (failedGroup), rather
	// than wait for a group that can no longer be whole.
	for i, resp := range responses {
		if resp.err != nil {
			for _, g := range respGroups[i] {
				if c.failedGroups[g] == nil {
					c.failedGroups[g] = &groupFailure{group: g, member: resp.err}
				}
			}
		}
	}
	for i, resp := range responses {
		if failed := c.failedGroup(respGroups[i]); resp.err == nil && failed != nil {
			resp.err = &Error{Op: "allreduce", Tensor: resp.spec.name, Reason: failed.Error()}
		}
		c.timeline.negotiated(resp.spec.name, resp.spec.kind, resp.spec.dtype, now)
		if resp.err == nil {
			c.cache.remember(resp.spec)
		}
	}
	c.table.settle(responses, remaining)
	return responses
}

// groupFailure is why a group failed: the first of its members to fail.
type groupFailure struct {
	group  string
	member *Error
}

func (f *groupFailure) Error() string {
	return fmt.Sprintf("%s fails as a whole: its member %q failed: %s", f.group, f.member.Tensor, f.member.Reason)
}

// failedGroup is the failure of the first of groups that has failed, or nil.
func (c *controller) failedGroup(groups []string) *groupFailure {
	for _, g := range groups {
		if f := c.failedGroups[g]; f != nil {
			return f
		}
	}
	return nil
}

// agree checks that every rank's spec for one operation match and builds its response.
func agree(name string, e *entry, size int) *response {
	var ref *spec
	for _, s := range e.specs {
		if s != nil {
			ref = s
			break
		}
	}
	resp := &response{spec: ref}
	if agreedAsIs(e.specs, ref) {
		return resp
	}
	fail := func(what string, key func(*spec) string) bool {
		vals := make([]string, size)
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
	case kindAllreduce, kindReducescatter:
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
	case kindProcessSet:
		if !fail("process set ranks", func(s *spec) string { return fmt.Sprint(s.members) }) {
			if joined := ranksWithout(e.specs); len(joined) > 0 {
				resp.err = &Error{Op: "process set", Tensor: name, Reason: "every rank adds a process set, and rank(s) " + strings.Join(joined, ",") + " have joined"}
			}
		}
	case kindAllgather, kindAlltoall:
		if len(ref.shape) == 0 {
			resp.err = &Error{Op: ref.kind.String(), Tensor: name, Reason: "a scalar has no first dimension to " + map[opKind]string{kindAllgather: "gather", kindAlltoall: "split"}[ref.kind] + " along"}
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
		if ref.kind == kindAlltoall {
			agreeAlltoall(resp, e.specs)
			return resp
		}
		resp.firstDims = make([]int, size)
		for r, s := range e.specs {
			if s != nil {
				resp.firstDims[r] = s.shape[0]
			}
		}
		// Each rank's part fits an int of bytes (checkShape, as its message is read), not
		// necessarily their sum: wrapped around, it would size the result negative and panic
		// the background loop, where damaged first dimensions must fail the operation.
		row, bytes := rowBytes(ref), 0
		for _, d := range resp.firstDims {
			if d*row > math.MaxInt-bytes {
				resp.err = &Error{Op: "allgather", Tensor: name, Reason: fmt.Sprintf("first dimensions %v of %d-byte rows gather more bytes than an int counts", resp.firstDims, row)}
				return resp
			}
			bytes += d * row
		}
	}
	return resp
}

// agreeAlltoall fills resp, an alltoall whose shapes agree, with every rank's splits, or fails
// it where a rank has joined (it would receive rows it never asked for, and send none: Horovod's
// alltoall refuses Join too) or a rank would receive more bytes than an int counts.
func agreeAlltoall(resp *response, specs []*spec) {
	name := resp.spec.name
	if joined := ranksWithout(specs); len(joined) > 0 {
		resp.err = &Error{Op: "alltoall", Tensor: name, Reason: "alltoall does not take part in Join: rank(s) " + strings.Join(joined, ",") + " have joined"}
		return
	}
	resp.splits = make([][]int, len(specs))
	for r, s := range specs {
		resp.splits[r] = s.splits
	}
	row := rowBytes(resp.spec)
	for to := range specs {
		bytes := 0
		for from := range specs {
			n := resp.splits[from][to] * row // within rank from's tensor: fits an int (checkShape)
			if n > math.MaxInt-bytes {
				resp.err = &Error{Op: "alltoall", Tensor: name, Reason: fmt.Sprintf("rank %d would receive more bytes than an int counts", to)}
				return
			}
			bytes += n
		}
	}
}

// ranksWithout lists the ranks that have not submitted an operation (they have joined).
func ranksWithout(specs []*spec) []string {
	var joined []string
	for r, s := range specs {
		if s == nil {
			joined = append(joined, strconv.Itoa(r))
		}
	}
	return joined
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
