package horovod

import (
	"fmt"
	"maps"
	"slices"
	"strings"
	"time"
)

// maxStallNames is how many stalled operations a stall report names per missing rank, as in
// Horovod: a model with hundreds of gradients would otherwise log hundreds of lines per check.
const maxStallNames = 6

// inspectStalls is Horovod's stall inspector. Operations that some ranks have submitted and others
// have not for longer than the stall-check time are reported by rank 0, grouped by missing rank
// as Horovod does ("1: [a, b, c]"); past the shutdown time (when set) the job is aborted, since
// ranks that submit different operations would otherwise wait forever. Init has already turned
// the shutdown off when it is shorter than the check time, as Horovod does.
func (c *controller) inspectStalls(now time.Time) {
	warn, abort := c.h.cfg.StallCheck, c.h.cfg.StallShutdown
	if warn == 0 && abort == 0 {
		return
	}
	threshold := warn
	if threshold == 0 {
		threshold = abort
	}
	missing := map[int][]string{} // rank -> stalled operations it has not submitted
	pastAbort := map[int]bool{}   // ranks missing an operation older than the shutdown time
	for _, name := range c.table.order {
		e := c.table.entries[name]
		age := now.Sub(e.firstSeen)
		if age < threshold {
			continue
		}
		for r, s := range e.specs {
			if s == nil && !c.table.joined(r) {
				missing[r] = append(missing[r], name)
				if abort > 0 && age >= abort {
					pastAbort[r] = true
				}
			}
		}
	}
	if len(missing) == 0 {
		return
	}
	report := stallReport(missing, pastAbort)
	if len(pastAbort) > 0 {
		c.h.log.Printf("aborting the job: ranks marked \"!\" have not submitted operations that others "+
			"submitted more than HOROVOD_STALL_SHUTDOWN_TIME_SECONDS (%v) ago. Missing ranks:\n%s", abort, report)
		c.control.Abort(1)
	}
	if c.rank == 0 && warn > 0 && now.Sub(c.lastWarn) >= warn {
		c.lastWarn = now
		c.h.log.Printf("stall: operations submitted by some ranks have waited more than %v for the others "+
			"(ranks that submit different operations, or skip one, deadlock here). Missing ranks:\n%s", warn, report)
	}
}

// stallReport lays out the stalled operations by missing rank, as Horovod does: one line per rank
// in rank order, at most maxStallNames names each in name order, "!" after a rank past the
// shutdown time.
func stallReport(missing map[int][]string, pastAbort map[int]bool) string {
	ranks := slices.Sorted(maps.Keys(missing))
	var b strings.Builder
	for i, r := range ranks {
		if i > 0 {
			b.WriteByte('\n')
		}
		names := slices.Sorted(slices.Values(missing[r]))
		mark := ""
		if pastAbort[r] {
			mark = "!"
		}
		fmt.Fprintf(&b, "%d%s: [%s]", r, mark, strings.Join(names[:min(len(names), maxStallNames)], ", "))
		if len(names) > maxStallNames {
			fmt.Fprintf(&b, " and %d more", len(names)-maxStallNames)
		}
	}
	return b.String()
}

// watchdog catches what the stall inspector cannot: a backend call that never returns because a
// peer died or hung inside a collective, which stops this rank's loop too. It warns after the
// stall-check time and aborts the job after the shutdown time.
func (c *controller) watchdog() {
	warn, abort := c.h.cfg.StallCheck, c.h.cfg.StallShutdown
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
