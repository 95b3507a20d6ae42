package horovod

import (
	"fmt"
	"maps"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/gorovod/gorovod/horovod/backend"
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
		age := c.stallAge(e, now)
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
		c.timeline.flushNow()
		c.control.Abort(1)
	}
	if c.rank == 0 && warn > 0 && now.Sub(c.lastWarn) >= warn {
		c.lastWarn = now
		c.h.log.Printf("stall: operations submitted by some ranks have waited more than %v for the others "+
			"(ranks that submit different operations, or skip one, deadlock here). Missing ranks:\n%s", warn, report)
	}
}

// stallAge is how long the ranks missing e have had to submit it: the time since it first
// appeared, less the time this loop has since spent inside backend calls. A rank whose loop was
// blocked in a collective (because another rank was stopped, say) could not announce what its
// application submitted meanwhile, and must not be blamed for the other rank's stall when the
// collective completes; the watchdog reports that stall, naming the late rank where it can.
func (c *controller) stallAge(e *entry, now time.Time) time.Duration {
	return now.Sub(e.firstSeen) - (c.busyTotal - e.busyAtFirstSeen)
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
	last := time.Now()
	for {
		stopping := false
		select {
		case <-c.stopped:
			stopping = true
		case <-tick.C:
		}
		// A tick that comes a stall-check time late: this process itself did not run (stopped by
		// SIGSTOP, or starved). The call in progress waited for nobody but this rank, so say
		// that instead of warning about it. Checked at the stop too: a rank continued just
		// before its last operations may reach Shutdown before this goroutine runs again.
		now := time.Now()
		gap := now.Sub(last)
		last = now
		since := c.busySince.Load()
		if warn > 0 && gap >= warn {
			c.h.log.Printf("stall: this rank did not run for %v (stopped, or starved of CPU): the other ranks waited for it", gap.Round(time.Millisecond))
			warned = since
		}
		if stopping {
			return
		}
		if since == 0 {
			continue
		}
		d := time.Duration(c.since(now) - since)
		what, _ := c.busyWhat.Load().(string)
		if abort > 0 && d >= abort {
			c.h.log.Printf("aborting the job: %s on the %s backend has not completed in %v "+
				"(HOROVOD_STALL_SHUTDOWN_TIME_SECONDS): %s", what, c.data.Name(), d.Round(time.Millisecond), c.stallCause(what))
			c.timeline.flushNow()
			c.control.Abort(1)
		}
		if warn > 0 && d >= warn && warned != since {
			warned = since
			c.h.log.Printf("stall: %s on the %s backend has not completed in %v: %s",
				what, c.data.Name(), d.Round(time.Millisecond), c.stallCause(what))
		}
	}
}

// lateRanks says what this rank knows about who is late in the blocked backend call what: the
// ranks that have not entered it when the backend keeps a roll call (backend.RollCall), and
// otherwise only that every rank submitted the operation, for a data collective, since MPI and
// NCCL do not tell which peer has not reached a collective.
func (c *controller) lateRanks(what string) string {
	for _, b := range []backend.Backend{c.control, c.data} {
		rc, ok := b.(backend.RollCall)
		if !ok {
			continue
		}
		reached, unknown, ok := rc.Reached()
		if !ok {
			continue
		}
		var late []int
		for r := range c.size {
			if !slices.Contains(reached, r) && !slices.Contains(unknown, r) {
				late = append(late, r)
			}
		}
		if len(late) == 0 && len(unknown) == 0 {
			return "every rank has entered it, so one has stopped inside it; the backend cannot tell which"
		}
		var parts []string
		if len(late) > 0 {
			parts = append(parts, fmt.Sprintf("%s not entered it (stopped, hung or dead)", ranksHave(late, "has", "have")))
		}
		parts = append(parts, ranksHave(reached, "has", "have")+" entered it")
		if len(unknown) > 0 {
			parts = append(parts, fmt.Sprintf("this rank cannot tell about %s (rank 0 can)", ranksHave(unknown, "", "")))
		}
		return strings.Join(parts, "; ")
	}
	if what == negotiationRound {
		return "a rank may have died, hung or been stopped; the " + c.control.Name() + " backend cannot tell which"
	}
	return "every rank submitted this operation, and the " + c.data.Name() +
		" backend cannot tell which has not entered the collective: a rank may have died, hung or been stopped"
}

// ranksHave renders "rank 1 has" or "ranks 0,2 have" (verb empty: the ranks alone).
func ranksHave(ranks []int, one, many string) string {
	s := make([]string, len(ranks))
	for i, r := range ranks {
		s[i] = strconv.Itoa(r)
	}
	if len(ranks) == 1 {
		return strings.TrimSpace("rank " + s[0] + " " + one)
	}
	return strings.TrimSpace("ranks " + strings.Join(s, ",") + " " + many)
}
