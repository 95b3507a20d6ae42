package horovod

import (
	"fmt"
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

	mu    sync.Mutex // guards queue and the fields down to joinResult
	queue tensorQueue
	// executing holds the requests taken out of the queue for the collective in progress (loop
	// goroutine only): when it fails they fail with it, since stop reaches only the requests in
	// flight and a caller waiting on a dropped request would wait forever (and Shutdown with it).
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

	// Owned by the loop goroutine; the first two are identical on every rank.
	table    *messageTable
	cache    *responseCache
	lastWarn time.Time
	fusion   arena // in the data backend's memory when it lends some (backend.HostAllocator)
	timeline *timeline

	busySince atomic.Int64  // unix ns when the current backend call began; 0 when none
	busyWhat  atomic.Value  // string: that call
	busyTotal time.Duration // time spent in backend calls so far (loop goroutine only)
}

func newController(h *Horovod, control, data backend.Backend) (*controller, error) {
	t := control.Topology()
	c := &controller{
		h: h, control: control, data: data, rank: t.Rank, size: t.Size,
		queue:   newTensorQueue(),
		wake:    make(chan struct{}, 1),
		stopped: make(chan struct{}),
		table:   newMessageTable(t.Size),
		cache:   newResponseCache(h.cfg.CacheCapacity),
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
	if p, ok := c.control.(backend.ThreadBound); ok {
		go p.Serve(c.loop) // MPI: the loop makes its calls itself, not through the MPI thread
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
	if err := c.queue.push(c.rank, reqs); err != nil {
		return err
	}
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
		shutdown, joined, reqs := c.shutdownAsked, c.joinAsked, c.queue.popQueued()
		c.mu.Unlock()
		msgs, err := exchange(c.negotiationAllgatherv, c.rank, c.size, announce(c.cache, reqs, shutdown, joined))
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
		if idle(msgs) && len(c.table.order) == 0 {
			wait = min(2*wait, maxIdleCycles*c.h.cfg.CycleTime)
		} else {
			wait = c.h.cfg.CycleTime
		}
		timer.Reset(wait)
	}
}

const maxIdleCycles = 16

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
	return c.busy(negotiationRound, func() error { return c.control.Allgatherv(send, recv, counts) })
}

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
