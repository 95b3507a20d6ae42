package horovod

import (
	"time"

	"github.com/gorovod/gorovod/horovod/backend"
)

// peerProbeTimeout is how long the watchdog waits for each peer to answer a probe: far above a
// network's round trip, far below the stall-check time.
const peerProbeTimeout = time.Second

// stallCause is the watchdog's account of backend call what, blocked past the stall-check or
// shutdown time: the ranks that are late (lateRanks), then what the network says.
func (c *controller) stallCause(what string) string {
	return c.lateRanks(what) + c.networkCause()
}

// networkCause is what the network says about a stalled backend call, for the watchdog's
// message: the peers that do not answer a probe (a machine or link down for good), that this
// machine is cut off, or that every peer answers. Empty when no backend can probe
// (backend.PeerProber). The control backend is asked first: it reaches every rank over the
// network whatever moves the data.
func (c *controller) networkCause() string {
	for _, b := range []backend.Backend{c.control, c.data} {
		if p, ok := b.(backend.PeerProber); ok {
			return "; network: " + p.ProbePeers(peerProbeTimeout)
		}
	}
	return ""
}
