package horovod

import (
	"bytes"
	"errors"
	"log"
	"strings"
	"testing"
	"time"
)

// The stall inspector reports an operation once it has waited the stall-check time, not
// before, and never names a rank that has joined (it has nothing left to submit).
func TestStallCheckTimeAndJoinedRanks(t *testing.T) {
	var out bytes.Buffer
	h := &Horovod{log: log.New(&out, "", 0)}
	h.cfg.StallCheck = time.Minute
	c := &controller{h: h, table: newMessageTable(3)}
	start := time.Now()
	c.table.add(0, allreduceSpec("grad", 1), start, 0)
	c.table.join(2)
	c.inspectStalls(start.Add(time.Minute - time.Millisecond))
	if out.Len() != 0 {
		t.Errorf("reported before the stall-check time:\n%s", &out)
	}
	c.inspectStalls(start.Add(time.Minute))
	if got := out.String(); !strings.HasSuffix(got, "Missing ranks:\n1: [grad]\n") {
		t.Errorf("at the stall-check time, with rank 2 joined, logged:\n%s", got)
	}
}

// A rank whose negotiation is blocked because another rank is stopped cannot announce what its
// application submits meanwhile. When the stopped rank continues, the stall report must not name
// the blocked rank (the one that was healthy all along) as missing that operation.
func TestStallReportDoesNotBlameTheRankThatWaited(t *testing.T) {
	g := newLoopback(3)
	var logs [3]syncBuffer
	hs, errs := initRanks(g, func(r int) []Option {
		return []Option{WithLogOutput(&logs[r]), WithStallCheck(100*time.Millisecond, 0)}
	})
	if err := errors.Join(errs...); err != nil {
		t.Fatal(err)
	}
	for _, h := range hs {
		defer h.Shutdown()
	}
	x := mustTensor(t, nil, []float32{1})
	// Ranks 1 and 2 submit; their announcement reaches every rank's table.
	h1, _ := hs[1].AllreduceAsync("grad", x, AllreduceOptions{})
	h2, _ := hs[2].AllreduceAsync("grad", x, AllreduceOptions{})
	time.Sleep(50 * time.Millisecond)
	// Rank 1 stops: every rank's negotiation blocks. Rank 0 submits meanwhile.
	stop := &stoppedRank{rank: 1, cont: make(chan struct{})}
	g.stopped.Store(stop)
	time.Sleep(20 * time.Millisecond)
	h0, _ := hs[0].AllreduceAsync("grad", x, AllreduceOptions{})
	time.Sleep(400 * time.Millisecond)
	close(stop.cont)
	for _, h := range []*Handle{h0, h1, h2} {
		if _, err := h.Wait(); err != nil {
			t.Fatal(err)
		}
	}
	got := logs[0].String()
	if strings.Contains(got, "Missing ranks:") {
		t.Errorf("rank 0 blamed a rank whose negotiation was blocked:\n%s", got)
	}
	// The watchdog saw the blocked round; the loopback keeps no roll call, so it says so.
	if !strings.Contains(got, "stall: negotiation allgather on the loopback backend has not completed in") ||
		!strings.Contains(got, "the loopback backend cannot tell which") {
		t.Errorf("rank 0's watchdog did not report the blocked round:\n%s", got)
	}
}
