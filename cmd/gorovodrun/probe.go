package main

// Probing the hosts for the network interfaces they share, as horovodrun does when a job spans
// several machines and no interface is named: otherwise Open MPI's TCP transport and NCCL's
// sockets try every interface, and one the machines cannot reach each other on (a docker
// bridge, whose address is the same on every machine; a management link that is down) hangs
// the job or sends it over the wrong network.
//
// gorovodrun starts itself on every host (one process a host, through mpirun, so with the job's
// own launch agent and ssh options) with probeFlag. Each probe listens on every IPv4 address of
// its up interfaces and connects back to gorovodrun, which listens on all of its own; it
// reports its addresses, gets its successor's (hosts in a ring, as horovodrun probes them),
// connects to each with a handshake that names the host that answered, and reports which of its
// successor's interfaces answered as that host. The interfaces every host was reached on are the
// ones the job uses (btl_tcp_if_include and NCCL_SOCKET_IFNAME, as --network-interface).
//
// The conversation is lines of words on each probe's connection to gorovodrun:
//
//	probe -> gorovodrun  hello TOKEN INDEX HOSTNAME, then addr IFACE IP:PORT ..., then ready
//	gorovodrun -> probe  welcome TOKEN, later peer IFACE IP:PORT ... (its successor's), then go NEXT
//	                     (the successor's index)
//	probe -> gorovodrun  reach IFACE IP:PORT ok | reach IFACE IP:PORT fail REASON..., then done
//	gorovodrun -> probe  exit, once every probe is done: until then each answers its predecessor
//
// and between probes, on a connection to a listening address: TOKEN FROM-INDEX, answered TOKEN
// INDEX. TOKEN, random for each launch, keeps a stray connection out of the conversation.

import (
	"bufio"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"
)

// probeFlag, as gorovodrun's first argument, makes it a probe (not in --help: gorovodrun
// starts it).
const probeFlag = "--probe-interfaces"

// DefaultStartTimeout is how long, in seconds, the probes have to start, connect and report
// (horovodrun's --start-timeout and HOROVOD_START_TIMEOUT, with its default).
const DefaultStartTimeout = 30

// probeDialTimeout bounds one connection attempt: a probe's to one of gorovodrun's addresses
// or to one of its successor's, where an unroutable address drops packets without an answer.
const probeDialTimeout = 5 * time.Second

// ifaceAddr is one IPv4 address of an interface, with a port where something listens on it.
type ifaceAddr struct {
	iface, addr string
}

// upIPv4Addrs lists the IPv4 addresses of this machine's interfaces that are up, loopback ones
// only when loopback is set (horovodrun's probes use IPv4 only too).
func upIPv4Addrs(loopback bool) ([]ifaceAddr, error) {
	ifaces, err := net.Interfaces()
	if err != nil {
		return nil, fmt.Errorf("listing network interfaces: %v", err)
	}
	var out []ifaceAddr
	for _, ifc := range ifaces {
		if ifc.Flags&net.FlagUp == 0 || !loopback && ifc.Flags&net.FlagLoopback != 0 {
			continue
		}
		addrs, err := ifc.Addrs()
		if err != nil {
			return nil, fmt.Errorf("addresses of %s: %v", ifc.Name, err)
		}
		for _, a := range addrs {
			if ipn, ok := a.(*net.IPNet); ok && ipn.IP.To4() != nil {
				out = append(out, ifaceAddr{ifc.Name, ipn.IP.String()})
			}
		}
	}
	return out, nil
}

// probeCommand is the mpirun command line (argv[0] "mpirun") that starts a probe on each of o's
// hosts: one rank a host, rank i on the i-th host, with gorovodrun's ssh options, the user's
// mpirun settings that concern starting processes (MCA parameters such as the launch agent or
// the out-of-band interfaces, --prefix, --launch-agent, -x) and the environment the job's ranks
// get; the binding and mapping of the job are not the probes'.
func probeCommand(o options, env []string, root bool, exe, token string, launcher []string) []string {
	argv := []string{"mpirun"}
	if root {
		argv = append(argv, "--allow-run-as-root")
	}
	one := make([]host, len(o.hosts))
	for i, h := range o.hosts {
		one[i] = host{name: h.name, slots: 1}
	}
	argv = append(argv, "-np", strconv.Itoa(len(one)), "-H", hostList(one), "--map-by", "slot", "--bind-to", "none")
	replaced := mpirunKeys(o.mpiArgs)
	if ssh := sshArgs(o); ssh != nil && !replaced[ssh.key] {
		argv = append(argv, ssh.args...)
	}
	for _, name := range forwardedVariables(env) {
		if !replaced["x:"+name] {
			argv = append(argv, "-x", name)
		}
	}
	opts, _ := parseMpirunArgs("--mpi-args", o.mpiArgs)
	for _, opt := range opts {
		switch opt.name {
		case "mca", "gmca", "prtemca", "pmixmca", "x", "prefix", "path", "launch-agent", "am", "tune":
			argv = append(argv, opt.word)
			argv = append(argv, opt.values...)
		}
	}
	return append(argv, exe, probeFlag, token, strings.Join(launcher, ","))
}

// needsProbe reports whether gorovodrun looks for the interfaces o's hosts share before the
// launch: ranks on several machines, and no interface chosen for MPI's TCP transport, by
// --network-interface, --mpi-args or the environment.
func needsProbe(o options, env []string) bool {
	replaced := mpirunKeys(o.mpiArgs)
	return len(o.hosts) > 1 && o.nics == nil && !replaced["mca:btl_tcp_if_include"] && !replaced["mca:btl_tcp_if_exclude"] &&
		!slices.ContainsFunc(env, func(kv string) bool {
			return strings.HasPrefix(kv, "OMPI_MCA_btl_tcp_if_include=") || strings.HasPrefix(kv, "OMPI_MCA_btl_tcp_if_exclude=")
		})
}

// noCommonInterfaceError is a probe that worked and found no interface every host is reached on.
type noCommonInterfaceError struct{ report string }

func (e *noCommonInterfaceError) Error() string {
	return "no network interface reaches every host (" + e.report + "); name the one to use with --network-interface"
}

// probeInterfaces runs the probes on o's hosts through mpirun (path) and returns the interfaces
// they share, sorted; a *noCommonInterfaceError when they share none, another error when the
// probes could not run or report.
func probeInterfaces(o options, env []string, root bool, path string, timeout time.Duration) ([]string, error) {
	exe, err := os.Executable()
	if err != nil {
		return nil, fmt.Errorf("finding gorovodrun's own path, which every host runs: %v", err)
	}
	ln, err := net.Listen("tcp4", ":0")
	if err != nil {
		return nil, fmt.Errorf("listening for the probes: %v", err)
	}
	defer ln.Close()
	port := strconv.Itoa(ln.Addr().(*net.TCPAddr).Port)
	mine, err := upIPv4Addrs(true)
	if err != nil {
		return nil, err
	}
	// Loopback addresses last: a probe tries them in order, and from another machine a loopback
	// address reaches that machine itself.
	sort.SliceStable(mine, func(i, j int) bool {
		return !net.ParseIP(mine[i].addr).IsLoopback() && net.ParseIP(mine[j].addr).IsLoopback()
	})
	var launcher []string
	for _, a := range mine {
		launcher = append(launcher, net.JoinHostPort(a.addr, port))
	}
	token, err := newToken()
	if err != nil {
		return nil, err
	}
	argv := probeCommand(o, env, root, exe, token, launcher)
	ctx, cancel := context.WithTimeout(context.Background(), timeout+probeDialTimeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, path, argv[1:]...)
	cmd.Env = env
	// Killing mpirun does not end its children: an ssh to a host that does not answer keeps
	// mpirun's output open for minutes, and Wait would wait for it, past the start timeout.
	cmd.WaitDelay = time.Second
	var output tailBuffer
	cmd.Stdout, cmd.Stderr = &output, &output
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("running %s: %v", path, err)
	}
	// exited hands mpirun's end to serveProbes, which may take it; ended is closed at the same
	// time, for waiting on mpirun after serveProbes failed.
	exited := make(chan error, 1)
	ended := make(chan struct{})
	go func() {
		err := cmd.Wait()
		close(ended)
		exited <- err
	}()
	reached, err := serveProbes(ln, token, len(o.hosts), time.Now().Add(timeout), exited)
	if err != nil {
		cancel()
		<-ended
		if tail := strings.TrimSpace(output.String()); tail != "" {
			err = fmt.Errorf("%v; mpirun said: %s", err, tail)
		}
		return nil, err
	}
	// Every probe reported: a child of mpirun holding its output past WaitDelay changes nothing.
	if err := <-exited; err != nil && !errors.Is(err, exec.ErrWaitDelay) {
		return nil, fmt.Errorf("the probes' mpirun: %v: %s", err, strings.TrimSpace(output.String()))
	}
	names := make([]string, len(o.hosts))
	for i, h := range o.hosts {
		names[i] = h.name
	}
	return commonInterfaces(names, reached)
}

func newToken() (string, error) {
	b := make([]byte, 16)
	if _, err := rand.Read(b); err != nil {
		return "", fmt.Errorf("making the probes' token: %v", err)
	}
	return hex.EncodeToString(b), nil
}

// reachReport is, for one host, what its predecessor's probe found on each of the host's
// interfaces: "" where the host answered, the reason where it did not.
type reachReport map[string]string

// probeConn is gorovodrun's side of one probe's connection.
type probeConn struct {
	index int
	conn  net.Conn
	addrs []ifaceAddr
}

// probeReport is what the probe of host index reached of its successor, or its error.
type probeReport struct {
	index   int
	reached reachReport
	err     error
}

// receive returns the next value of ch, or an error saying what was awaited when the probes'
// mpirun exits or the deadline (timeout) passes first.
func receive[T any](ch <-chan T, exited <-chan error, timeout <-chan time.Time, what string) (T, error) {
	var zero T
	select {
	case v := <-ch:
		return v, nil
	case err := <-exited:
		if err == nil {
			err = errors.New("exited")
		}
		return zero, fmt.Errorf("the probes' mpirun ended before %s: %v", what, err)
	case <-timeout:
		return zero, fmt.Errorf("no answer by the start timeout: %s", what)
	}
}

// serveProbes holds the conversation (see the top of this file) with n probes connecting to ln
// and returns, for each host index, what its predecessor reached of it. It fails when a probe
// does not report by deadline, or the probes' mpirun exits first.
func serveProbes(ln net.Listener, token string, n int, deadline time.Time, exited <-chan error) ([]reachReport, error) {
	ready := make(chan *probeConn, n)
	reports := make(chan probeReport, n)
	stop := make(chan struct{})
	// Run last to first: the listener closed, the connections let go, then waited for.
	var conns sync.WaitGroup
	defer conns.Wait()
	defer close(stop)
	defer ln.Close()
	conns.Add(1) // the accepting goroutine, so that no Add comes after Wait has begun
	go func() {
		defer conns.Done()
		for {
			conn, err := ln.Accept()
			if err != nil {
				return
			}
			conns.Add(1)
			go func() {
				defer conns.Done()
				serveProbe(conn, token, n, deadline, ready, reports, stop)
			}()
		}
	}()

	timer := time.NewTimer(time.Until(deadline))
	defer timer.Stop()
	probes := make([]*probeConn, n)
	for range n {
		p, err := receive(ready, exited, timer.C, "every host's probe reported its addresses")
		if err != nil {
			return nil, fmt.Errorf("%v (%s)", err, missing(probes))
		}
		if probes[p.index] != nil {
			return nil, fmt.Errorf("two probes say they are host %d", p.index)
		}
		probes[p.index] = p
	}
	for i, p := range probes {
		var b strings.Builder
		for _, a := range probes[(i+1)%n].addrs {
			fmt.Fprintf(&b, "peer %s %s\n", a.iface, a.addr)
		}
		fmt.Fprintf(&b, "go %d\n", (i+1)%n)
		if _, err := io.WriteString(p.conn, b.String()); err != nil {
			return nil, fmt.Errorf("host %d's probe: %v", i, err)
		}
	}
	reached := make([]reachReport, n)
	for range n {
		r, err := receive(reports, exited, timer.C, "every host's probe reported what it reached")
		if err != nil {
			return nil, err
		}
		if r.err != nil {
			return nil, fmt.Errorf("host %d's probe: %v", r.index, r.err)
		}
		reached[(r.index+1)%n] = r.reached
	}
	for _, p := range probes {
		io.WriteString(p.conn, "exit\n")
	}
	return reached, nil
}

// missing names the host indexes no probe has said it is.
func missing(probes []*probeConn) string {
	var idx []string
	for i, p := range probes {
		if p == nil {
			idx = append(idx, strconv.Itoa(i))
		}
	}
	return "no probe from host " + strings.Join(idx, ", ")
}

// serveProbe reads one connection: a probe's hello and addresses (then it is sent to ready),
// then its reach report. A connection that does not start with the token is closed.
func serveProbe(conn net.Conn, token string, n int, deadline time.Time, ready chan<- *probeConn, reports chan<- probeReport, stop <-chan struct{}) {
	defer conn.Close()
	conn.SetDeadline(deadline)
	r := bufio.NewReader(conn)
	hello, err := readWords(r)
	if err != nil || len(hello) < 3 || hello[0] != "hello" || hello[1] != token {
		return
	}
	index, err := strconv.Atoi(hello[2])
	if err != nil || index < 0 || index >= n {
		return
	}
	if _, err := io.WriteString(conn, "welcome "+token+"\n"); err != nil {
		return
	}
	p := &probeConn{index: index, conn: conn}
	// A report waits for room only while gorovodrun listens (a probe it refused reports too).
	report := func(r probeReport) {
		r.index = index
		select {
		case reports <- r:
		case <-stop:
		}
	}
	for {
		w, err := readWords(r)
		if err != nil {
			return
		}
		if len(w) == 1 && w[0] == "ready" {
			break
		}
		if len(w) != 3 || w[0] != "addr" {
			return
		}
		p.addrs = append(p.addrs, ifaceAddr{w[1], w[2]})
	}
	select {
	case ready <- p:
	case <-stop:
		return
	}
	reached := reachReport{}
	for {
		w, err := readWords(r)
		if err != nil {
			report(probeReport{err: fmt.Errorf("its connection: %v", err)})
			return
		}
		if len(w) == 1 && w[0] == "done" {
			break
		}
		if len(w) < 4 || w[0] != "reach" {
			report(probeReport{err: fmt.Errorf("unexpected %q", strings.Join(w, " "))})
			return
		}
		iface, ok := w[1], w[3] == "ok"
		why := strings.Join(w[4:], " ")
		// An interface answered where any of its addresses did.
		switch prev, seen := reached[iface]; {
		case ok || seen && prev == "":
			reached[iface] = ""
		case seen:
			reached[iface] = prev + "; " + why
		default:
			reached[iface] = why
		}
	}
	report(probeReport{reached: reached})
	// Hold the connection until gorovodrun has written exit (or gives up): the probe answers
	// its predecessor until then.
	<-stop
}

func readWords(r *bufio.Reader) ([]string, error) {
	line, err := r.ReadString('\n')
	if err != nil {
		return nil, err
	}
	return strings.Fields(line), nil
}

// commonInterfaces is the interfaces (sorted) that every host was reached on by its
// predecessor's probe, reached[i] being host i's report; a *noCommonInterfaceError, naming what
// each host's interfaces answered, when there is none.
func commonInterfaces(hosts []string, reached []reachReport) ([]string, error) {
	var common []string
	for iface, why := range reached[0] {
		if why == "" {
			common = append(common, iface)
		}
	}
	for _, r := range reached[1:] {
		common = slices.DeleteFunc(common, func(iface string) bool {
			why, ok := r[iface]
			return !ok || why != ""
		})
	}
	if len(common) > 0 {
		sort.Strings(common)
		return common, nil
	}
	var parts []string
	for i, r := range reached {
		from := hosts[(i+len(hosts)-1)%len(hosts)]
		ifaces := make([]string, 0, len(r))
		for iface := range r {
			ifaces = append(ifaces, iface)
		}
		sort.Strings(ifaces)
		var got []string
		for _, iface := range ifaces {
			if why := r[iface]; why == "" {
				got = append(got, iface+" answered")
			} else {
				got = append(got, iface+": "+why)
			}
		}
		if len(got) == 0 {
			got = []string{"it has no up IPv4 interface but loopback"}
		}
		parts = append(parts, fmt.Sprintf("%s from %s: %s", hosts[i], from, strings.Join(got, ", ")))
	}
	return nil, &noCommonInterfaceError{strings.Join(parts, "; ")}
}

// tailBuffer keeps the last 4 KiB written to it: the probes' mpirun output, for a message.
type tailBuffer struct {
	mu  sync.Mutex
	buf []byte
}

func (t *tailBuffer) Write(p []byte) (int, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.buf = append(t.buf, p...)
	if over := len(t.buf) - 4096; over > 0 {
		t.buf = t.buf[over:]
	}
	return len(p), nil
}

func (t *tailBuffer) String() string {
	t.mu.Lock()
	defer t.mu.Unlock()
	return string(t.buf)
}

// runProbe is gorovodrun started with probeFlag on one host by probeInterfaces: args are the
// token and gorovodrun's addresses (comma-separated); the host's index is its MPI rank. It
// returns the exit status.
func runProbe(args []string, stderr io.Writer) int {
	host, _ := os.Hostname()
	fail := func(err error) int {
		fmt.Fprintf(stderr, "gorovodrun %s on %s: %v\n", probeFlag, host, err)
		return 1
	}
	if len(args) != 2 {
		return fail(fmt.Errorf("want TOKEN ADDR[,ADDR...], got %q", args))
	}
	index, err := strconv.Atoi(os.Getenv("OMPI_COMM_WORLD_RANK"))
	if err != nil {
		return fail(errors.New("OMPI_COMM_WORLD_RANK is not set: gorovodrun starts the probes with mpirun"))
	}
	addrs, err := upIPv4Addrs(false)
	if err != nil {
		return fail(err)
	}
	token := args[0]
	listening, stop := listenAll(addrs, token, index)
	defer stop()
	if err := probe(index, host, token, strings.Split(args[1], ","), listening); err != nil {
		return fail(err)
	}
	return 0
}

// listenAll listens on each of addrs (interface and IP), answering probes as host index, and
// returns the addresses with their ports and a function that stops listening. An address that
// cannot be bound is left out: it is not one to reach this host on.
func listenAll(addrs []ifaceAddr, token string, index int) ([]ifaceAddr, func()) {
	var listening []ifaceAddr
	var lns []net.Listener
	for _, a := range addrs {
		ln, err := net.Listen("tcp4", net.JoinHostPort(a.addr, "0"))
		if err != nil {
			continue
		}
		lns = append(lns, ln)
		listening = append(listening, ifaceAddr{a.iface, ln.Addr().String()})
		go answerProbes(ln, token, index)
	}
	return listening, func() {
		for _, ln := range lns {
			ln.Close()
		}
	}
}

// probe is one host's side of the conversation (see the top of this file), once it listens on
// listening: it reports them to gorovodrun at one of launcher's addresses, probes its
// successor's and answers its predecessor's probe until gorovodrun says exit.
func probe(index int, host, token string, launcher []string, listening []ifaceAddr) error {
	conn, r, err := dialLauncher(launcher, token, index, host)
	if err != nil {
		return err
	}
	defer conn.Close()
	var b strings.Builder
	for _, a := range listening {
		fmt.Fprintf(&b, "addr %s %s\n", a.iface, a.addr)
	}
	b.WriteString("ready\n")
	if _, err := io.WriteString(conn, b.String()); err != nil {
		return fmt.Errorf("reporting to gorovodrun: %v", err)
	}
	var peers []ifaceAddr
	next := -1
	for next < 0 {
		w, err := readWords(r)
		if err != nil {
			return fmt.Errorf("waiting for the next host's addresses: %v", err)
		}
		if len(w) == 2 && w[0] == "go" {
			if next, err = strconv.Atoi(w[1]); err != nil || next < 0 {
				return fmt.Errorf("gorovodrun said %q", strings.Join(w, " "))
			}
			continue
		}
		if len(w) != 3 || w[0] != "peer" {
			return fmt.Errorf("gorovodrun said %q", strings.Join(w, " "))
		}
		peers = append(peers, ifaceAddr{w[1], w[2]})
	}
	results := make([]string, len(peers))
	var wg sync.WaitGroup
	for i, p := range peers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			results[i] = "reach " + p.iface + " " + p.addr + " ok"
			if err := knock(p.addr, token, index, next); err != nil {
				results[i] = "reach " + p.iface + " " + p.addr + " fail " + strings.Join(strings.Fields(err.Error()), " ")
			}
		}()
	}
	wg.Wait()
	if _, err := io.WriteString(conn, strings.Join(append(results, "done"), "\n")+"\n"); err != nil {
		return fmt.Errorf("reporting to gorovodrun: %v", err)
	}
	// Answer the predecessor until gorovodrun says every probe is done (or goes away).
	readWords(r)
	return nil
}

// dialLauncher connects to gorovodrun at the first of its addresses that answers with the
// token, and says hello.
func dialLauncher(launcher []string, token string, index int, host string) (net.Conn, *bufio.Reader, error) {
	var errs []string
	for _, addr := range launcher {
		conn, err := net.DialTimeout("tcp4", addr, probeDialTimeout)
		if err != nil {
			errs = append(errs, err.Error())
			continue
		}
		conn.SetDeadline(time.Now().Add(probeDialTimeout))
		r := bufio.NewReader(conn)
		_, err = fmt.Fprintf(conn, "hello %s %d %s\n", token, index, host)
		var w []string
		if err == nil {
			w, err = readWords(r)
		}
		if err == nil && len(w) == 2 && w[0] == "welcome" && w[1] == token {
			conn.SetDeadline(time.Time{})
			return conn, r, nil
		}
		conn.Close()
		if err == nil {
			err = errors.New("not gorovodrun's answer")
		}
		errs = append(errs, fmt.Sprintf("%s: %v", addr, err))
	}
	return nil, nil, fmt.Errorf("reaching gorovodrun at none of %s: %s", strings.Join(launcher, ", "), strings.Join(errs, "; "))
}

// answerProbes answers, on ln, each connection that brings the token: with this host's index.
func answerProbes(ln net.Listener, token string, index int) {
	for {
		conn, err := ln.Accept()
		if err != nil {
			return
		}
		go func() {
			defer conn.Close()
			conn.SetDeadline(time.Now().Add(probeDialTimeout))
			w, err := readWords(bufio.NewReader(conn))
			if err == nil && len(w) == 2 && w[0] == token {
				fmt.Fprintf(conn, "%s %d\n", token, index)
			}
		}()
	}
}

// knock connects to addr as host from and checks that host want answers there: an address
// the same on every machine (a docker bridge's) reaches the prober's own machine, or nothing.
func knock(addr, token string, from, want int) error {
	conn, err := net.DialTimeout("tcp4", addr, probeDialTimeout)
	if err != nil {
		return err
	}
	defer conn.Close()
	conn.SetDeadline(time.Now().Add(probeDialTimeout))
	if _, err := fmt.Fprintf(conn, "%s %d\n", token, from); err != nil {
		return err
	}
	w, err := readWords(bufio.NewReader(conn))
	if err != nil {
		return fmt.Errorf("no answer: %v", err)
	}
	if len(w) != 2 || w[0] != token {
		return errors.New("something else answers there")
	}
	if got, _ := strconv.Atoi(w[1]); got != want {
		return fmt.Errorf("host %d answers there, not host %d", got, want)
	}
	return nil
}
