// Package peerprobe finds which peers of a job this process can still reach over the network,
// without the collectives that block when one cannot be reached. Every rank listens on a TCP port
// that answers connections and does nothing else; the ranks exchange their host names and
// addresses once, when the job starts (Record, Parse); when a collective stalls, Probe connects
// to every peer with a short timeout and Describe names the ranks, machines and addresses that
// did not answer, or says that this machine is the one cut off. A backend uses it to implement
// backend.PeerProber; it has no cgo and no MPI of its own.
package peerprobe

import (
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"
)

// RecordSize is the size of one rank's record in the exchange: fixed, so that the exchange is a
// single allgather of equal parts.
const RecordSize = 1024

// Peer is one rank as the others see it: its host name and the addresses ("ip:port") its
// listener answers on.
type Peer struct {
	Rank  int      `json:"-"`
	Host  string   `json:"host"`
	Addrs []string `json:"addrs,omitempty"`
}

// Listener answers TCP connections on every interface of this machine and closes them at once:
// a peer that connects knows this process is alive and its machine reachable.
type Listener struct {
	ln   net.Listener
	done sync.WaitGroup
}

// Listen opens the listener on a port the system chooses.
func Listen() (*Listener, error) {
	ln, err := net.Listen("tcp", ":0")
	if err != nil {
		return nil, fmt.Errorf("peerprobe: listening for probes: %w", err)
	}
	l := &Listener{ln: ln}
	l.done.Go(func() {
		for {
			conn, err := ln.Accept()
			if err != nil {
				return // closed
			}
			conn.Close()
		}
	})
	return l, nil
}

// Port is the port the listener answers on.
func (l *Listener) Port() int { return l.ln.Addr().(*net.TCPAddr).Port }

// Close stops answering.
func (l *Listener) Close() error {
	err := l.ln.Close()
	l.done.Wait()
	return err
}

// Self is this process as its peers will probe it: the host name and each address of this
// machine on which the job's own traffic may travel, with port. include is the interface
// selection of the job's transport (Open MPI's btl_tcp_if_include: interface names or CIDR
// blocks, comma-separated), empty for every interface but loopback; loopback addresses are used
// only where the machine has nothing else (a job on one machine).
func Self(port int, include string) (Peer, error) {
	host, err := os.Hostname()
	if err != nil {
		return Peer{}, fmt.Errorf("peerprobe: host name: %w", err)
	}
	ifaces, err := net.Interfaces()
	if err != nil {
		return Peer{}, fmt.Errorf("peerprobe: network interfaces: %w", err)
	}
	var addrs, loopback []string
	for _, ifc := range ifaces {
		if ifc.Flags&net.FlagUp == 0 {
			continue
		}
		ifAddrs, err := ifc.Addrs()
		if err != nil {
			continue
		}
		for _, a := range ifAddrs {
			ipn, ok := a.(*net.IPNet)
			if !ok || ipn.IP.IsLinkLocalUnicast() || !selected(ifc.Name, ipn.IP, include) {
				continue
			}
			hostPort := net.JoinHostPort(ipn.IP.String(), strconv.Itoa(port))
			if ipn.IP.IsLoopback() {
				loopback = append(loopback, hostPort)
			} else {
				addrs = append(addrs, hostPort)
			}
		}
	}
	if len(addrs) == 0 {
		addrs = loopback
	}
	return Peer{Host: host, Addrs: addrs}, nil
}

// selected reports whether address ip of interface name is in include (see Self).
func selected(name string, ip net.IP, include string) bool {
	if strings.TrimSpace(include) == "" {
		return true
	}
	for _, item := range strings.Split(include, ",") {
		item = strings.TrimSpace(item)
		if _, block, err := net.ParseCIDR(item); err == nil {
			if block.Contains(ip) {
				return true
			}
		} else if item == name {
			return true
		}
	}
	return false
}

// Record encodes p in RecordSize bytes, zero-padded, dropping addresses that do not fit.
func Record(p Peer) []byte {
	for {
		b, err := json.Marshal(p)
		if err == nil && len(b) <= RecordSize {
			out := make([]byte, RecordSize)
			copy(out, b)
			return out
		}
		if len(p.Addrs) == 0 {
			// A host name too long for a record (or escaped into too long a one): keep its start.
			p.Host = p.Host[:len(p.Host)/2]
			continue
		}
		p.Addrs = p.Addrs[:len(p.Addrs)-1]
	}
}

// Parse decodes the records of every rank, laid end to end in rank order as an allgather
// leaves them. A rank whose record is empty (its listener failed) has no address to probe.
func Parse(records []byte) ([]Peer, error) {
	if len(records)%RecordSize != 0 {
		return nil, fmt.Errorf("peerprobe: %d bytes of records, not a multiple of %d", len(records), RecordSize)
	}
	peers := make([]Peer, len(records)/RecordSize)
	for r := range peers {
		rec := records[r*RecordSize : (r+1)*RecordSize]
		if n := strings.IndexByte(string(rec), 0); n >= 0 {
			rec = rec[:n]
		}
		if len(rec) > 0 {
			if err := json.Unmarshal(rec, &peers[r]); err != nil {
				return nil, fmt.Errorf("peerprobe: the record of rank %d: %w", r, err)
			}
		}
		peers[r].Rank = r
	}
	return peers, nil
}

// Dial connects to addr within timeout and hangs up: nil when something answers there.
type Dial func(addr string, timeout time.Duration) error

// TCPDial is Dial over TCP.
func TCPDial(addr string, timeout time.Duration) error {
	conn, err := net.DialTimeout("tcp", addr, timeout)
	if err != nil {
		return err
	}
	return conn.Close()
}

// Result is the probe of one peer: Err is nil when one of its addresses answered, else the
// failure at its first address.
type Result struct {
	Peer Peer
	Err  error
}

// errNoAddress is the result of a peer that published no address.
var errNoAddress = errors.New("it published no address to probe")

// Probe connects to every peer but self, all at once, each address within timeout; it returns
// after at most about timeout.
func Probe(peers []Peer, self int, timeout time.Duration, dial Dial) []Result {
	var results []Result
	for _, p := range peers {
		if p.Rank != self {
			results = append(results, Result{Peer: p, Err: errNoAddress})
		}
	}
	var wg sync.WaitGroup
	for i := range results {
		addrs := results[i].Peer.Addrs
		if len(addrs) == 0 {
			continue
		}
		errs := make([]error, len(addrs))
		var peerWG sync.WaitGroup
		for j, a := range addrs {
			peerWG.Go(func() { errs[j] = dial(a, timeout) })
		}
		wg.Go(func() {
			peerWG.Wait()
			results[i].Err = errs[0]
			for _, err := range errs {
				if err == nil {
					results[i].Err = nil
				}
			}
		})
	}
	wg.Wait()
	return results
}

// Describe says, in one sentence for a stall message, what the probe of self's peers found: the
// ranks that did not answer, grouped by machine, with their addresses and why, or that every peer
// answered. When no rank on another machine answers it says that this machine is the one cut off
// if it can tell: there is no route to any of them (its own link is down), or several other
// machines are silent at once. With one other machine silent after a timeout, either link may be
// the one down, and it names the other machine only.
func Describe(self Peer, results []Result) string {
	if len(results) == 0 {
		return "no peer to probe"
	}
	var failed []Result
	remote, remoteFailed, remoteNoRoute := 0, 0, 0
	for _, r := range results {
		if r.Peer.Host == self.Host {
			if r.Err != nil {
				failed = append(failed, r)
			}
			continue
		}
		remote++
		if r.Err != nil {
			failed = append(failed, r)
			remoteFailed++
			if noRoute(r.Err) {
				remoteNoRoute++
			}
		}
	}
	if len(failed) == 0 {
		return fmt.Sprintf("every peer answers on the network (%s), so the network is not what stalls", count(len(results), "rank"))
	}
	var cutOff string
	if remote > 0 && remoteFailed == remote && (remoteNoRoute == remote || len(hosts(failed, self.Host)) > 1) {
		cutOff = fmt.Sprintf("no peer on another machine answers: this machine's (%s) network is down or cut off from the others; ", self.Host)
	}
	// One phrase per machine and reason, in rank order of first appearance.
	type group struct {
		host, reason string
		ranks, addrs []string
	}
	var groups []*group
	for _, r := range failed {
		why := reason(r.Err)
		i := slices.IndexFunc(groups, func(g *group) bool { return g.host == r.Peer.Host && g.reason == why })
		if i < 0 {
			i = len(groups)
			groups = append(groups, &group{host: r.Peer.Host, reason: why})
		}
		g := groups[i]
		g.ranks = append(g.ranks, strconv.Itoa(r.Peer.Rank))
		for _, a := range r.Peer.Addrs {
			if h, _, err := net.SplitHostPort(a); err == nil && !slices.Contains(g.addrs, h) {
				g.addrs = append(g.addrs, h)
			}
		}
	}
	parts := make([]string, len(groups))
	for i, g := range groups {
		who, verb := "rank "+g.ranks[0]+" on "+g.host, "does"
		if len(g.ranks) > 1 {
			who, verb = "ranks "+strings.Join(g.ranks, ",")+" on "+g.host, "do"
		}
		if len(g.addrs) > 0 {
			who += " (" + strings.Join(g.addrs, ", ") + ")"
		}
		parts[i] = fmt.Sprintf("%s %s not answer: %s", who, verb, g.reason)
	}
	return cutOff + strings.Join(parts, "; ")
}

// noRoute: this machine has no route to the peer's network, as when its own link is down (the
// kernel removes the link's routes with its carrier).
func noRoute(err error) bool { return errors.Is(err, syscall.ENETUNREACH) }

// reason says why a connection failed, in a few words.
func reason(err error) string {
	var ne net.Error
	switch {
	case errors.Is(err, errNoAddress):
		return err.Error()
	case errors.As(err, &ne) && ne.Timeout():
		return "connect timeout (the machine or its link is down)"
	case errors.Is(err, syscall.ECONNREFUSED):
		return "connection refused (its machine answers, the process is gone)"
	case noRoute(err):
		return "network unreachable (this machine's link is down)"
	case errors.Is(err, syscall.EHOSTUNREACH):
		return "no route to its host"
	}
	return err.Error()
}

func hosts(results []Result, except string) []string {
	var hs []string
	for _, r := range results {
		if r.Peer.Host != except && !slices.Contains(hs, r.Peer.Host) {
			hs = append(hs, r.Peer.Host)
		}
	}
	return hs
}

func count(n int, what string) string {
	if n == 1 {
		return "1 " + what
	}
	return strconv.Itoa(n) + " " + what + "s"
}
