package horovod

import (
	"errors"
	"strings"
	"testing"
	"time"
)

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
