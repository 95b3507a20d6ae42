package horovod

import (
	"fmt"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/gorovod/gorovod/horovod/backend"
)

// controller is the background loop of one process and the state it negotiates.
type controller struct {
	h             *Horovod
	control, data backend.Backend
	rank, size    int

	mu    sync.Mutex // guards queue and the fields down to groups
	queue tensorQueue
	// executing holds the requests taken out of the queue for the collective in progress (turn
	// holder only): when it fails they fail with it, since stop reaches only the requests in
	// flight and a caller waiting on a dropped request would wait forever (and Shutdown with it).
	executing     []*request
	stopErr       error // non-nil once the loop has ended: why
	shutdownAsked bool
	joinAsked     bool
	joinResult    chan int
	groups        uint64 // groups (of any grouped operation) queued so far: groups are numbered in queueing order
	wake          chan struct{}
	stopped       chan struct{}
	// closing is held for reading by callers that touch memory the data backend lent (a
	// Reducer's arenas) and for writing while Shutdown closes the backends, which frees it.
	closing sync.RWMutex

	// turn is held by whoever runs a negotiation round and the collectives it agrees on: the
	// background loop, or the caller of a blocking operation that runs the round announcing it
	// (see await). Rounds never overlap, so this rank makes its collectives one at a time, in
	// the order every other rank makes them.
	turn sync.Mutex
	// Rounds run on this rank, those a caller ran, blocking operations handed to the loop, and
	// the times a caller that ran rounds yielded its processor (see callerYieldInterval).
	rounds, callerRounds, handOvers, callerYields atomic.Uint64
	// epoch is when the controller was made; the times below are nanoseconds since it (since),
	// read on Go's monotonic clock: a step of the wall clock (NTP, a VM resumed) would otherwise
	// hold the loop's timed rounds back, or make a short backend call look stalled, by the step.
	epoch time.Time
	// callerRoundAt is when a caller last ran a round: the loop's cycle counts from it.
	callerRoundAt atomic.Int64
	// callerYieldAt is when a caller last yielded after its round (turn holder only).
	callerYieldAt int64

	// Owned by the holder of turn; the first two are identical on every rank.
	table *messageTable
	cache *responseCache
	// failedGroups holds the groups that have failed, by group name: their members
	// still to be answered fail too (answer). Forgotten when the ranks number groups afresh.
	failedGroups map[string]*groupFailure
	lastWarn     time.Time
	fusion       arena  // in the data backend's memory when it lends some (backend.HostAllocator)
	adasumBuf    []byte // every rank's shard of an Adasum allreduce on this rank
	timeline     *timeline

	busySince atomic.Int64  // when the current backend call began (since; at least 1); 0 when none
	busyWhat  atomic.Value  // string: that call
	busyTotal time.Duration // time spent in backend calls so far (turn holder only)
}

func newController(h *Horovod, control, data backend.Backend) (*controller, error) {
	t := control.Topology()
	c := &controller{
		h: h, control: control, data: data, rank: t.Rank, size: t.Size,
		queue:        newTensorQueue(),
		wake:         make(chan struct{}, 1),
		stopped:      make(chan struct{}),
		table:        newMessageTable(t.Size),
		cache:        newResponseCache(h.cfg.CacheCapacity),
		epoch:        time.Now(),
		failedGroups: map[string]*groupFailure{},
	}
	c.fusion = h.hostArena(data)
	if h.members == nil && t.Rank == 0 {
		// The job's rank 0 alone writes the timeline (a process set's controller is given a view
		// of it); it records from here with HOROVOD_TIMELINE, otherwise once StartTimeline is called.
		c.timeline = newTimeline()
		if h.cfg.Timeline != "" {
			if err := c.timeline.startFile(h.cfg.Timeline); err != nil {
				return nil, fmt.Errorf("HOROVOD_TIMELINE: %w", err)
			}
		}
	}
	return c, nil
}

// start runs the background loop and its watchdog; Init calls it once every rank is set up.
func (c *controller) start() {
	if p, ok := c.control.(backend.ThreadBound); ok {
		go p.Serve(c.loop) // MPI: the loop makes its calls itself, not through the MPI thread
	} else {
		go c.loop()
	}
	go c.watchdog()
}

// submit queues reqs and wakes the background loop to announce them, for operations that
// return before they complete.
func (c *controller) submit(reqs ...*request) error {
	if err := c.enqueue(reqs); err != nil {
		return err
	}
	c.poke()
	return nil
}

// enqueue queues reqs atomically (one negotiation round sees all of them, so they can fuse).
func (c *controller) enqueue(reqs []*request) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.stopErr != nil {
		return c.stopErr
	}
	if c.joinAsked {
		return fmt.Errorf("horovod: rank %d has called Join: it submits no more operations until every rank has joined", c.rank)
	}
	if err := c.queue.push(c.rank, reqs); err != nil {
		return err
	}
	if len(reqs) > 0 && reqs[0].groupSize > 0 {
		// Numbered once queued: a call refused on this rank alone (a name already in flight here, a
		// Join in progress) must not move this rank's count of groups away from the others'.
		c.groups++
		group := fmt.Sprintf("group.%d", c.groups)
		for _, r := range reqs {
			r.group = group
		}
	}
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

// loop is the background loop: wait for work or the cycle time, run a round, repeat.
func (c *controller) loop() {
	defer close(c.stopped)
	wait := c.h.cfg.CycleTime
	timer := time.NewTimer(wait)
	defer timer.Stop()
	// Callers running rounds in step keep the other ranks' operations moving as the loop's timed
	// rounds would: a round of the loop's own in between would meet a caller's on another rank,
	// so that neither completes its operation in it. A timed round waits for a cycle after the
	// last caller's round.
	sinceCallerRound := func() time.Duration {
		return time.Duration(c.since(time.Now()) - c.callerRoundAt.Load())
	}
	for {
		timed := false
		select {
		case <-c.wake:
		case <-timer.C:
			timed = true
		}
		if timed && !c.turn.TryLock() {
			// A caller's round is in progress, and it negotiates for this rank. Waiting for it on
			// the lock would cost two thread wake-ups per caller round (parking, then the hand-over
			// at its Unlock), which on a machine whose cores all run ranks take CPU from the rank
			// its collective waits for: a 16 MiB allreduce took 25% longer than raw MPI's. The
			// timer backs off as idle rounds do instead.
			wait = c.idleWait(wait)
			timer.Reset(wait)
			continue
		}
		if !timed {
			c.turn.Lock() // a caller's round in progress ends first
		}
		if since := sinceCallerRound(); timed && since < wait {
			c.turn.Unlock()
			timer.Reset(wait - since)
			continue
		}
		busy, over := c.round(false)
		c.turn.Unlock()
		if over {
			return
		}
		// While no rank has anything to negotiate, idle rounds back off (idleWait). A submission
		// still starts a round at once.
		if busy {
			wait = c.h.cfg.CycleTime
		} else {
			wait = c.idleWait(wait)
		}
		timer.Reset(wait)
	}
}

// round negotiates once with the other ranks and runs the collectives every rank is ready for;
// its caller holds turn, and byCaller says it is await's caller. busy reports that some rank had
// something to negotiate or that operations are still waiting; over, that the loop has ended (in
// this round or an earlier one: a failure, or a shutdown).
func (c *controller) round(byCaller bool) (busy, over bool) {
	c.mu.Lock()
	stopped, shutdown, joined, reqs := c.stopErr != nil, c.shutdownAsked, c.joinAsked, c.queue.popQueued()
	c.mu.Unlock()
	if stopped {
		return false, true
	}
	c.rounds.Add(1)
	if byCaller {
		c.callerRounds.Add(1)
		defer func() { c.callerRoundAt.Store(c.since(time.Now())) }()
	}
	msgs, err := exchange(c.negotiationAllgatherv, c.rank, c.size, announce(c.cache, reqs, shutdown, joined))
	if err != nil {
		c.fail(fmt.Errorf("horovod: negotiation failed on rank %d: %w", c.rank, err))
		return false, true
	}
	responses, stopBy, lastJoined, err := c.process(msgs)
	if err != nil {
		c.fail(fmt.Errorf("horovod: rank %d: %w", c.rank, err))
		return false, true
	}
	if err := c.execute(responses); err != nil {
		c.fail(err)
		return false, true
	}
	if lastJoined >= 0 {
		c.mu.Lock()
		// The ranks that joined early took part in the others' groups without a Grouped call of
		// their own: every rank counts its groups afresh, as all have nothing in flight.
		c.groups = 0
		clear(c.failedGroups)
		if c.joinAsked {
			c.joinAsked = false
			c.joinResult <- lastJoined
		}
		c.mu.Unlock()
	}
	if stopBy >= 0 {
		c.stop(fmt.Errorf("%w (Shutdown called on rank %d)", ErrShutdown, stopBy))
		return false, true
	}
	c.timeline.flushIfDue()
	return !idle(msgs) || len(c.table.order) != 0, false
}

// await submits reqs and waits until they complete, for an operation that blocks its caller.
// When no round is in progress on this rank, the caller runs the next one itself, on its own
// goroutine; where every rank's operation arrives in that round (ranks in step, as in a
// training loop) it completes without being handed to the background loop and back. Each such
// hand-over makes a goroutine runnable, for which Go wakes a thread on another core: on a machine
// whose cores all run ranks, that thread takes CPU from the rank this one is waiting for
// (measured: a 4 KiB allreduce's collectives took 2-5 times as long with the hand-overs as
// with GOMAXPROCS=1, which has none). Otherwise the background loop runs the rounds, as for
// asynchronous operations.
func (c *controller) await(reqs ...*request) error {
	if err := c.enqueue(reqs); err != nil {
		return err
	}
	over, yield := false, false
	if c.turn.TryLock() {
		_, over = c.round(true)
		if at := c.callerRoundAt.Load(); at-c.callerYieldAt >= int64(callerYieldInterval) {
			c.callerYieldAt, yield = at, true
		}
		c.turn.Unlock()
	}
	if yield {
		c.callerYields.Add(1)
		runtime.Gosched()
	}
	handOver := !completed(reqs)
	if handOver {
		c.handOvers.Add(1)
	}
	// When the round just run ended the controller, the loop wakes to end now rather than at its
	// next timer.
	if handOver || over {
		c.poke()
	}
	for _, r := range reqs {
		<-r.done
	}
	return nil
}

// awaitOne is await for one request, returning its result.
func (c *controller) awaitOne(req *request) (Tensor, error) {
	if err := c.await(req); err != nil {
		return Tensor{}, err
	}
	return req.result, req.err
}

// callerYieldInterval is how often a goroutine that runs rounds itself (await's caller) passes
// through Go's scheduler (runtime.Gosched). Ranks in step complete every operation in their
// caller's round, so that goroutine may never block, and Go's sysmon takes the processor from a
// goroutine that has run for 10 ms without being scheduled; when the goroutine is in a cgo call
// (an MPI collective), that is a hand-off of its processor, and each one sets sysmon back to
// waking every 20 µs, which it only backs off from after 50 wakes with nothing to take. On a
// machine whose cores all run ranks, each of those wakes takes a core from a rank in a
// collective, and the other ranks wait for it. Measured on a 2-core AMD EPYC, 2 ranks, 20,000
// BroadcastVariables of 1 MiB back to back: 30,000-34,000 context switches in the run (42% of
// them sysmon's) and 76-93 µs a call (the best batch of 2,000), against raw MPI_Bcast's 60 µs;
// yielding every 5 ms, about 6,000 and 71-73 µs. Yielding after every round was slower (78 µs):
// Gosched wakes a thread for the idle processor, which can take the goroutine to another thread.
const callerYieldInterval = 5 * time.Millisecond

// completed reports whether every one of reqs has completed.
func completed(reqs []*request) bool {
	for _, r := range reqs {
		select {
		case <-r.done:
		default:
			return false
		}
	}
	return true
}

// maxIdleWait is the longest wait between idle rounds (or one cycle time, when that is longer).
// An idle round costs every rank a collective, and the rank that arrives first wakes its thread
// again and again until the last one arrives: while a 2-rank MiniLM job computed its ~0.9 s
// train step, rounds every 16 ms made that step 2-3% slower and took 2.6% of the job's
// examples/s (6 pairs of runs, bfloat16, 2 cores). What waits for an idle rank's next round is
// what reaches it while it is idle: another rank's Shutdown or Join (their first round; the
// announcement then makes every round busy) and the stall check's view of who has submitted.
const maxIdleWait = time.Second

// minIdleWait is where idle rounds start to back off from under a cycle time shorter than it:
// doubling from 0 (HOROVOD_CYCLE_TIME=0) would never leave 0, and the idle ranks would run
// collectives back to back, hundreds of thousands a second.
const minIdleWait = time.Millisecond

// idleWait is the wait after an idle round that waited wait: twice as long (at least
// minIdleWait), up to maxIdleWait.
func (c *controller) idleWait(wait time.Duration) time.Duration {
	return min(max(2*wait, minIdleWait), max(maxIdleWait, c.h.cfg.CycleTime))
}

// fail ends the loop after a backend or protocol failure, and the job with it: the other ranks
// cannot complete a collective without this one, and would otherwise wait forever.
func (c *controller) fail(err error) {
	c.h.log.Printf("%v: aborting the job, since the other ranks cannot go on without this one", err)
	c.stop(err)
	c.timeline.flushNow()
	c.control.Abort(1)
}

// stop ends the loop: every operation still waiting on this rank fails with err.
func (c *controller) stop(err error) {
	c.mu.Lock()
	c.stopErr = err
	pending := c.queue.drain()
	c.mu.Unlock()
	for _, r := range pending {
		r.complete(Tensor{}, err)
	}
}

// negotiationRound is what the watchdog calls a blocked negotiation allgather.
const negotiationRound = "negotiation allgather"

// negotiationAllgatherv is the control backend's allgather, for exchange, under the watchdog's eye.
func (c *controller) negotiationAllgatherv(send, recv []byte, counts []int) error {
	return c.busy(negotiationRound, func() error { return backend.ControlAllgatherv(c.control, send, recv, counts) })
}

// since is t in the controller's clock: nanoseconds since epoch, on the monotonic clock.
func (c *controller) since(t time.Time) int64 { return int64(t.Sub(c.epoch)) }

// busy runs one backend call under the watchdog's eye.
func (c *controller) busy(what string, f func() error) error {
	start := time.Now()
	c.busyWhat.Store(what)
	c.busySince.Store(max(1, c.since(start)))
	defer func() {
		c.busySince.Store(0)
		c.busyTotal += time.Since(start)
	}()
	return f()
}
