package horovod

import (
	"fmt"
	"strconv"
	"strings"
	"time"
)

// inspectStalls is Horovod's stall inspector. Operations that some ranks have submitted and others
// have not for longer than the stall-check time are reported by rank 0, naming each operation and
// the ranks missing it; past the shutdown time (when set) the job is aborted, since ranks that
// submit different operations would otherwise wait forever.
func (c *controller) inspectStalls(now time.Time) {
	warn, abort := c.h.cfg.stallCheck, c.h.cfg.stallShutdown
	if warn == 0 && abort == 0 {
		return
	}
	threshold := warn
	if threshold == 0 || abort > 0 && abort < threshold {
		threshold = abort
	}
	var lines []string
	var oldest time.Duration
	for _, name := range c.order {
		e := c.table[name]
		age := now.Sub(e.firstSeen)
		if age < threshold {
			continue
		}
		oldest = max(oldest, age)
		var missing []string
		var kind opKind
		for r, s := range e.specs {
			if s == nil && c.joinedAt[r] < 0 {
				missing = append(missing, strconv.Itoa(r))
			} else if s != nil {
				kind = s.kind
			}
		}
		lines = append(lines, fmt.Sprintf("  %s %q (waiting %v): missing ranks %s",
			kind, name, age.Round(time.Second), strings.Join(missing, ",")))
	}
	if lines == nil {
		return
	}
	report := strings.Join(lines, "\n")
	if abort > 0 && oldest >= abort {
		c.h.log.Printf("aborting the job: operations stalled for more than HOROVOD_STALL_SHUTDOWN_TIME_SECONDS (%v):\n%s", abort, report)
		c.control.Abort(1)
	}
	if c.rank == 0 && warn > 0 && now.Sub(c.lastWarn) >= warn {
		c.lastWarn = now
		c.h.log.Printf("stall: operations submitted by some ranks have waited more than %v for the others "+
			"(ranks that submit different operations, or skip one, deadlock here):\n%s", warn, report)
	}
}

// watchdog catches what the stall inspector cannot: a backend call that never returns because a
// peer died or hung inside a collective, which stops this rank's loop too. It warns after the
// stall-check time and aborts the job after the shutdown time.
func (c *controller) watchdog() {
	warn, abort := c.h.cfg.stallCheck, c.h.cfg.stallShutdown
	if warn == 0 && abort == 0 {
		return
	}
	period := time.Second
	for _, d := range []time.Duration{warn, abort} {
		if d > 0 {
			period = min(period, max(d/10, 10*time.Millisecond))
		}
	}
	tick := time.NewTicker(period)
	defer tick.Stop()
	var warned int64
	for {
		select {
		case <-c.stopped:
			return
		case <-tick.C:
		}
		since := c.busySince.Load()
		if since == 0 {
			continue
		}
		d := time.Since(time.Unix(0, since))
		what, _ := c.busyWhat.Load().(string)
		if abort > 0 && d >= abort {
			c.h.log.Printf("aborting the job: %s on the %s backend has not completed in %v "+
				"(HOROVOD_STALL_SHUTDOWN_TIME_SECONDS): a rank has probably died or hung", what, c.data.Name(), d.Round(time.Millisecond))
			c.control.Abort(1)
		}
		if warn > 0 && d >= warn && warned != since {
			warned = since
			c.h.log.Printf("stall: %s on the %s backend has not completed in %v: a rank may have died or hung",
				what, c.data.Name(), d.Round(time.Millisecond))
		}
	}
}
