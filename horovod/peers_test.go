package horovod

import (
	"errors"
	"fmt"
	"strings"
	"sync/atomic"
	"testing"
	"time"
)

// probingRank is a loopback rank whose backend can probe its peers (backend.PeerProber): it says
// what a real probe would when rank 1's machine is unreachable, and counts the probes.
type probingRank struct {
	loopRank
	probes *atomic.Int64
}

func (p probingRank) ProbePeers(timeout time.Duration) string {
	p.probes.Add(1)
	return fmt.Sprintf("rank 1 on nodeb (198.18.0.2) does not answer: connect timeout (probed within %v)", timeout)
}

// A collective that stalls because a peer's machine cannot be reached: the watchdog's warning
// carries what the probe found, after who is late, on the ranks whose backend can probe.
func TestStallWarningSaysWhatTheNetworkProbeFound(t *testing.T) {
	g := newLoopback(2)
	var logs [2]syncBuffer
	var probes atomic.Int64
	hs, errs := initRanks(g, func(r int) []Option {
		return []Option{WithBackend(probingRank{loopRank{g, r}, &probes}), WithLogOutput(&logs[r]),
			WithStallCheck(time.Second, 0)}
	})
	if err := errors.Join(errs...); err != nil {
		t.Fatal(err)
	}
	for _, h := range hs {
		defer h.Shutdown()
	}
	x := mustTensor(t, nil, []float32{1})
	stop := &stoppedRank{rank: 1, cont: make(chan struct{})}
	g.stopped.Store(stop)
	h0, _ := hs[0].AllreduceAsync("grad", x, AllreduceOptions{})
	// Well past the check time: a watchdog tick delayed by a loaded machine by as much as the
	// check time would take the stall for this process's own (and say that instead).
	time.Sleep(2500 * time.Millisecond)
	h1, _ := hs[1].AllreduceAsync("grad", x, AllreduceOptions{})
	close(stop.cont)
	for _, h := range []*Handle{h0, h1} {
		if _, err := h.Wait(); err != nil {
			t.Fatal(err)
		}
	}
	got := logs[0].String()
	want := "the loopback backend cannot tell which; network: rank 1 on nodeb (198.18.0.2) does not answer: connect timeout (probed within 1s)"
	if !strings.Contains(got, "stall: negotiation allgather on the loopback backend has not completed in") || !strings.Contains(got, want) {
		t.Errorf("rank 0's stall warning lacks the probe's finding %q:\n%s", want, got)
	}
	if probes.Load() == 0 {
		t.Error("no rank probed its peers")
	}
}
