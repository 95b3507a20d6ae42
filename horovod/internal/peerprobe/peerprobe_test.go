package peerprobe

import (
	"errors"
	"net"
	"os"
	"strings"
	"syscall"
	"testing"
	"time"
)

// timeoutErr is what net.DialTimeout returns when nothing answers in time.
type timeoutErr struct{}

func (timeoutErr) Error() string   { return "i/o timeout" }
func (timeoutErr) Timeout() bool   { return true }
func (timeoutErr) Temporary() bool { return true }

func dialErr(errno syscall.Errno) error {
	return &net.OpError{Op: "dial", Net: "tcp", Err: os.NewSyscallError("connect", errno)}
}

// fakeDial answers at every address but those in fail, which fail with their error.
func fakeDial(fail map[string]error) Dial {
	return func(addr string, _ time.Duration) error { return fail[addr] }
}

// cluster: ranks 0,1 on nodea, 2,3 on nodeb, 4 on nodec.
func cluster() []Peer {
	return []Peer{
		{Rank: 0, Host: "nodea", Addrs: []string{"198.18.0.1:4000"}},
		{Rank: 1, Host: "nodea", Addrs: []string{"198.18.0.1:4001"}},
		{Rank: 2, Host: "nodeb", Addrs: []string{"198.18.0.2:4000"}},
		{Rank: 3, Host: "nodeb", Addrs: []string{"198.18.0.2:4001"}},
		{Rank: 4, Host: "nodec", Addrs: []string{"198.18.0.3:4000", "10.0.0.3:4000"}},
	}
}

func TestDescribe(t *testing.T) {
	peers := cluster()
	for _, tc := range []struct {
		name string
		self int
		fail map[string]error
		want string
	}{
		{"every peer answers", 0, nil,
			"every peer answers on the network (4 ranks), so the network is not what stalls"},
		{"one machine's link down, seen from another", 0,
			map[string]error{"198.18.0.2:4000": timeoutErr{}, "198.18.0.2:4001": timeoutErr{}},
			"ranks 2,3 on nodeb (198.18.0.2) do not answer: connect timeout (the machine or its link is down)"},
		{"a process gone, its machine up", 2,
			map[string]error{"198.18.0.1:4001": dialErr(syscall.ECONNREFUSED)},
			"rank 1 on nodea (198.18.0.1) does not answer: connection refused (its machine answers, the process is gone)"},
		{"a peer answering on one of its addresses answers", 0,
			map[string]error{"10.0.0.3:4000": timeoutErr{}},
			"every peer answers on the network (4 ranks), so the network is not what stalls"},
		{"a peer silent on all its addresses is named with all of them", 0,
			map[string]error{"10.0.0.3:4000": timeoutErr{}, "198.18.0.3:4000": timeoutErr{}},
			"rank 4 on nodec (198.18.0.3, 10.0.0.3) does not answer: connect timeout (the machine or its link is down)"},
		{"this machine's link down: no route to any other", 4,
			map[string]error{
				"198.18.0.1:4000": dialErr(syscall.ENETUNREACH), "198.18.0.1:4001": dialErr(syscall.ENETUNREACH),
				"198.18.0.2:4000": dialErr(syscall.ENETUNREACH), "198.18.0.2:4001": dialErr(syscall.ENETUNREACH),
			},
			"no peer on another machine answers: this machine's (nodec) network is down or cut off from the others; " +
				"ranks 0,1 on nodea (198.18.0.1) do not answer: network unreachable (this machine's link is down); " +
				"ranks 2,3 on nodeb (198.18.0.2) do not answer: network unreachable (this machine's link is down)"},
		{"two other machines silent: this one is cut off", 4,
			map[string]error{
				"198.18.0.1:4000": timeoutErr{}, "198.18.0.1:4001": timeoutErr{},
				"198.18.0.2:4000": timeoutErr{}, "198.18.0.2:4001": timeoutErr{},
			},
			"no peer on another machine answers: this machine's (nodec) network is down or cut off from the others; " +
				"ranks 0,1 on nodea (198.18.0.1) do not answer: connect timeout (the machine or its link is down); " +
				"ranks 2,3 on nodeb (198.18.0.2) do not answer: connect timeout (the machine or its link is down)"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := Describe(peers[tc.self], Probe(peers, tc.self, time.Second, fakeDial(tc.fail)))
			if got != tc.want {
				t.Errorf("got  %q\nwant %q", got, tc.want)
			}
		})
	}
}

func TestDescribeTwoMachines(t *testing.T) {
	peers := cluster()[1:3] // rank 1 on nodea, rank 2 on nodeb
	peers[0].Rank, peers[1].Rank = 0, 1
	// The survivor cannot tell whose link is down: it names the other machine only.
	got := Describe(peers[0], Probe(peers, 0, time.Second, fakeDial(map[string]error{"198.18.0.2:4000": timeoutErr{}})))
	if want := "rank 1 on nodeb (198.18.0.2) does not answer: connect timeout (the machine or its link is down)"; got != want {
		t.Errorf("survivor: got %q, want %q", got, want)
	}
	// The machine whose link is down has no route: it says it is cut off.
	got = Describe(peers[1], Probe(peers, 1, time.Second, fakeDial(map[string]error{"198.18.0.1:4001": dialErr(syscall.ENETUNREACH)})))
	if !strings.HasPrefix(got, "no peer on another machine answers: this machine's (nodeb) network is down") {
		t.Errorf("cut-off machine: got %q", got)
	}
}

func TestRecordRoundTrip(t *testing.T) {
	peers := cluster()
	var all []byte
	for _, p := range peers {
		all = append(all, Record(p)...)
	}
	all = append(all, make([]byte, RecordSize)...) // a rank whose listener failed sends zeros
	got, err := Parse(all)
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != len(peers)+1 {
		t.Fatalf("%d peers parsed, want %d", len(got), len(peers)+1)
	}
	for r, p := range peers {
		if got[r].Rank != r || got[r].Host != p.Host || strings.Join(got[r].Addrs, " ") != strings.Join(p.Addrs, " ") {
			t.Errorf("rank %d: got %+v, want %+v", r, got[r], p)
		}
	}
	last := got[len(peers)]
	if last.Rank != len(peers) || last.Host != "" || len(last.Addrs) != 0 {
		t.Errorf("empty record: got %+v", last)
	}
	res := Probe(got, 0, time.Second, fakeDial(nil))
	if want := "rank 5 on  does not answer: it published no address to probe"; !strings.Contains(Describe(got[0], res), want) {
		t.Errorf("a peer without a record: %q lacks %q", Describe(got[0], res), want)
	}

	// Too many addresses for a record: those that do not fit are dropped, the record stays whole.
	big := Peer{Host: "nodea"}
	for i := range 200 {
		big.Addrs = append(big.Addrs, net.JoinHostPort(net.IPv4(198, 18, byte(i/250), byte(i%250)).String(), "4000"))
	}
	rec := Record(big)
	if len(rec) != RecordSize {
		t.Fatalf("record of %d bytes, want %d", len(rec), RecordSize)
	}
	back, err := Parse(rec)
	if err != nil || back[0].Host != "nodea" || len(back[0].Addrs) == 0 || len(back[0].Addrs) >= len(big.Addrs) {
		t.Errorf("oversized record: %v, %d addresses back of %d", err, len(back[0].Addrs), len(big.Addrs))
	}
	// A host name whose JSON escapes outgrow a record is shortened until it fits.
	odd := Record(Peer{Host: strings.Repeat("\x01", RecordSize)})
	if back, err := Parse(odd); err != nil || len(back[0].Host) == 0 || !strings.HasPrefix(strings.Repeat("\x01", RecordSize), back[0].Host) {
		t.Errorf("a host name too long for a record: %v, %+v", err, back)
	}
	if _, err := Parse(rec[:100]); err == nil {
		t.Error("Parse accepted a partial record")
	}
}

// The listener and TCPDial over loopback: a live listener answers; once closed, its port refuses.
func TestListenerAnswers(t *testing.T) {
	l, err := Listen()
	if err != nil {
		t.Fatal(err)
	}
	self, err := Self(l.Port(), "127.0.0.0/8")
	if err != nil {
		t.Fatal(err)
	}
	if len(self.Addrs) == 0 || !strings.HasPrefix(self.Addrs[0], "127.") {
		t.Fatalf("Self with include 127.0.0.0/8: addresses %v", self.Addrs)
	}
	peers := []Peer{{Rank: 0, Host: "me"}, {Rank: 1, Host: self.Host, Addrs: self.Addrs}}
	if got := Probe(peers, 0, time.Second, TCPDial); got[0].Err != nil {
		t.Errorf("a live listener: %v", got[0].Err)
	}
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	got := Probe(peers, 0, time.Second, TCPDial)
	if !errors.Is(got[0].Err, syscall.ECONNREFUSED) {
		t.Fatalf("a closed listener: %v, want connection refused", got[0].Err)
	}
	if want := "connection refused (its machine answers, the process is gone)"; !strings.HasSuffix(Describe(peers[0], got), want) {
		t.Errorf("%q does not end with %q", Describe(peers[0], got), want)
	}
}

func TestSelected(t *testing.T) {
	ip := net.ParseIP("198.18.0.2")
	for _, tc := range []struct {
		include string
		want    bool
	}{
		{"", true},
		{"198.18.0.0/15", true},
		{"10.0.0.0/8, 198.18.0.0/24", true},
		{"10.0.0.0/8", false},
		{"fake0", true},
		{"eth0", false},
	} {
		if got := selected("fake0", ip, tc.include); got != tc.want {
			t.Errorf("selected(fake0, %v, %q) = %v, want %v", ip, tc.include, got, tc.want)
		}
	}
}
