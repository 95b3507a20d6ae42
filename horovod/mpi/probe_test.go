package mpi

import (
	"fmt"
	"net"
	"os"
	"strings"
	"testing"
	"time"
)

// Every rank published its own host name, and an address on the simulated machines' network
// when it runs on one (make test-multinode); every live peer answers a probe.
func TestProbePeersAllAnswer(t *testing.T) {
	topo := need(t)
	host, err := os.Hostname()
	if err != nil {
		t.Fatal(err)
	}
	if got := comm.peers[topo.Rank].Host; got != host {
		t.Errorf("rank %d published host %q, its host name is %q", topo.Rank, got, host)
	}
	if os.Getenv("GOROVOD_FAKE_NODES_IF") != "" {
		_, block, _ := net.ParseCIDR("198.18.0.0/15")
		for _, p := range comm.peers {
			for _, a := range p.Addrs {
				h, _, _ := net.SplitHostPort(a)
				if !block.Contains(net.ParseIP(h)) {
					t.Errorf("rank %d published %s, outside the simulated network 198.18.0.0/15", p.Rank, a)
				}
			}
		}
	}
	if topo.Size < 2 {
		return
	}
	want := fmt.Sprintf("every peer answers on the network (%d rank", topo.Size-1)
	if got := comm.ProbePeers(time.Second); !strings.HasPrefix(got, want) {
		t.Errorf("rank %d: ProbePeers = %q, want it to start with %q", topo.Rank, got, want)
	}
	// No rank may go on to the next test, which closes a listener, before all have probed.
	if err := comm.Barrier(); err != nil {
		t.Fatal(err)
	}
}

// The last rank stops answering probes, as when its process is gone but its machine is up:
// rank 0 names it, its host and the refusal. Runs last in the package: the listener stays closed.
func TestProbePeersNamesAGoneRank(t *testing.T) {
	topo := need(t)
	if topo.Size < 2 {
		t.Skip("needs 2 ranks")
	}
	last := topo.Size - 1
	if topo.Rank == last {
		comm.closeProbe()
	}
	if err := comm.Barrier(); err != nil {
		t.Fatal(err)
	}
	if topo.Rank == 0 {
		p := comm.peers[last]
		want := fmt.Sprintf("rank %d on %s (", last, p.Host)
		got := comm.ProbePeers(time.Second)
		if !strings.Contains(got, want) || !strings.Contains(got, "does not answer: connection refused (its machine answers, the process is gone)") {
			t.Errorf("ProbePeers = %q, want it to name rank %d on %s, refused", got, last, p.Host)
		}
	}
	if err := comm.Barrier(); err != nil {
		t.Fatal(err)
	}
}
