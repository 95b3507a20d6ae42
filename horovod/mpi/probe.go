package mpi

import (
	"os"
	"time"

	"github.com/gorovod/gorovod/horovod/backend"
	"github.com/gorovod/gorovod/horovod/internal/peerprobe"
)

var (
	_ backend.PeerProber = (*Comm)(nil)
	_ backend.Negotiator = (*Comm)(nil)
)

// probeListenerNetworks names the networks MPI's TCP transport is restricted to, if it is
// (mpirun --mca btl_tcp_if_include, or the variable itself under srun): the probes then go where
// the job's traffic goes.
const probeListenerNetworks = "OMPI_MCA_btl_tcp_if_include"

// openProbe makes this rank answer its peers' probes and learns where to probe them: one
// allgather of every rank's host and addresses, at Open. A rank whose listener cannot open
// still joins the allgather, with an empty record (its peers then say it published no address):
// failing Open on that rank alone would leave the others blocked in the allgather.
func (c *Comm) openProbe() error {
	rec := make([]byte, peerprobe.RecordSize)
	ln, err := peerprobe.Listen()
	if err == nil {
		var self peerprobe.Peer
		if self, err = peerprobe.Self(ln.Port(), os.Getenv(probeListenerNetworks)); err == nil {
			rec = peerprobe.Record(self)
		} else {
			ln.Close()
			ln = nil
		}
	}
	all, err := c.allgatherEqual(rec)
	if err != nil {
		if ln != nil {
			ln.Close()
		}
		return err
	}
	peers, err := peerprobe.Parse(all)
	if err != nil {
		if ln != nil {
			ln.Close()
		}
		return err
	}
	c.probeListener, c.peers = ln, peers
	return nil
}

// ProbePeers connects to every other rank's probe listener, all at once, each within timeout
// (backend.PeerProber): it needs no MPI call, so it answers while a collective is blocked on a
// peer that cannot be reached.
func (c *Comm) ProbePeers(timeout time.Duration) string {
	results := peerprobe.Probe(c.peers, c.topo.Rank, timeout, peerprobe.TCPDial)
	return peerprobe.Describe(c.peers[c.topo.Rank], results)
}

// closeProbe stops answering probes: a peer probing later hears that this process is gone.
func (c *Comm) closeProbe() {
	if c.probeListener != nil {
		c.probeListener.Close()
	}
}
