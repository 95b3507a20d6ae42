package main

import (
	"errors"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"
)

// The interfaces every host is reached on, whatever else each answers on; none in common is an
// error that says, per host, what each interface answered.
func TestCommonInterfaces(t *testing.T) {
	hosts := []string{"a", "b", "c"}
	common, err := commonInterfaces(hosts, []reachReport{
		{"eth0": "", "docker0": "host 0 answers there, not host 0", "ib0": ""},
		{"eth0": "", "ib0": ""},
		{"eth0": "", "ib0": "i/o timeout"},
	})
	if err != nil || !reflect.DeepEqual(common, []string{"eth0"}) {
		t.Errorf("got %q, %v; want [eth0]", common, err)
	}
	_, err = commonInterfaces(hosts, []reachReport{
		{"eth0": ""},
		{"eth1": "", "docker0": "host 0 answers there, not host 1"},
		{},
	})
	var none *noCommonInterfaceError
	if !errors.As(err, &none) {
		t.Fatalf("got %v, want a noCommonInterfaceError", err)
	}
	for _, want := range []string{"a from c: eth0 answered", "b from a: docker0: host 0 answers there, not host 1, eth1 answered",
		"c from b: it has no up IPv4 interface but loopback"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("%q does not say %q", err, want)
		}
	}
}

// Three probes in this process, as three hosts would run them, over loopback addresses: each
// reports its interfaces, knocks on its successor's and gorovodrun gets what answered. Host 2
// has "eth1" on an address where host 0 listens too (the docker bridge's case: the same address
// on every machine), so host 1 reaching it reaches host 0 and eth1 is not common.
func TestProbeConversation(t *testing.T) {
	ln, err := net.Listen("tcp4", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	token := "t0k"
	const n = 3
	exited := make(chan error, 1)
	probeErrs := make(chan error, n)
	// A listener standing for host 0 on the address host 2 reports for eth1.
	impostor, err := net.Listen("tcp4", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer impostor.Close()
	go answerProbes(impostor, token, 0)
	for i := range n {
		listening, stop := listenAll([]ifaceAddr{{"eth0", "127.0.0.1"}}, token, i)
		defer stop()
		if i == 2 {
			listening = append(listening, ifaceAddr{"eth1", impostor.Addr().String()})
		}
		go func() { probeErrs <- probe(i, "h", token, []string{ln.Addr().String()}, listening) }()
	}
	reached, err := serveProbes(ln, token, n, time.Now().Add(20*time.Second), exited)
	if err != nil {
		t.Fatal(err)
	}
	for range n {
		if err := <-probeErrs; err != nil {
			t.Errorf("probe: %v", err)
		}
	}
	want := []reachReport{{"eth0": ""}, {"eth0": ""}, {"eth0": "", "eth1": "host 0 answers there, not host 2"}}
	if !reflect.DeepEqual(reached, want) {
		t.Errorf("reached %q, want %q", reached, want)
	}
	if common, err := commonInterfaces([]string{"a", "b", "c"}, reached); err != nil || !reflect.DeepEqual(common, []string{"eth0"}) {
		t.Errorf("common %q, %v; want [eth0]", common, err)
	}
}

// A probe job that ends before every probe reported (mpirun could not start one) fails at once,
// naming the hosts missing; so does one that outlives the start timeout.
func TestServeProbesFailures(t *testing.T) {
	for _, tc := range []struct {
		exit bool
		want string
	}{
		{true, "the probes' mpirun ended before every host's probe reported its addresses: exit status 1 (no probe from host 0, 1)"},
		{false, "no answer by the start timeout: every host's probe reported its addresses (no probe from host 0, 1)"},
	} {
		ln, err := net.Listen("tcp4", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		exited := make(chan error, 1)
		if tc.exit {
			exited <- errors.New("exit status 1")
		}
		start := time.Now()
		_, err = serveProbes(ln, "t", 2, time.Now().Add(300*time.Millisecond), exited)
		if err == nil || err.Error() != tc.want {
			t.Errorf("got %v, want %s", err, tc.want)
		}
		if d := time.Since(start); d > 5*time.Second {
			t.Errorf("took %v", d)
		}
	}
}

// A probes' mpirun that ends at once (its daemons could not start: ssh refused, a host down)
// makes probeInterfaces return the error, which the launch warns about and goes on; it hung,
// waiting a second time for the end serveProbes had already taken.
func TestProbeInterfacesReturnsWhenMpirunEnds(t *testing.T) {
	falsePath, err := exec.LookPath("false")
	if err != nil {
		t.Skip("no false")
	}
	o := mustParse(t, "-np", "2", "-H", "a:1,b:1", "prog")
	done := make(chan error, 1)
	go func() {
		_, err := probeInterfaces(o, nil, false, falsePath, 30*time.Second)
		done <- err
	}()
	select {
	case err := <-done:
		if want := "the probes' mpirun ended before every host's probe reported its addresses: exit status 1"; err == nil || !strings.HasPrefix(err.Error(), want) {
			t.Errorf("got %v, want %s...", err, want)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("probeInterfaces did not return 10 s after its mpirun ended")
	}
}

// The start timeout bounds the probe even where mpirun's children (ssh to a host that does not
// answer) keep its output open after mpirun is killed: probeInterfaces waited for them to end.
func TestProbeInterfacesStartTimeoutBoundsMpirunsChildren(t *testing.T) {
	mpirun := filepath.Join(t.TempDir(), "mpirun")
	if err := os.WriteFile(mpirun, []byte("#!/bin/sh\nsleep 30 &\nexec sleep 30\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	o := mustParse(t, "-np", "2", "-H", "a:1,b:1", "prog")
	start := time.Now()
	_, err := probeInterfaces(o, nil, false, mpirun, time.Second)
	if want := "no answer by the start timeout"; err == nil || !strings.HasPrefix(err.Error(), want) {
		t.Errorf("got %v, want %s...", err, want)
	}
	if d := time.Since(start); d > 15*time.Second {
		t.Errorf("returned %v after the start of a probe with a start timeout of 1 s", d.Round(time.Second))
	}
}
