package conformance

import (
	"bufio"
	"net"
	"os"
	"strconv"
	"strings"
	"testing"

	"github.com/gorovod/gorovod/horovod"
	"github.com/gorovod/gorovod/horovod/backend"
)

// wireEnv names the interface of each simulated machine (scripts/fake-nodes/mpirun.sh sets it:
// each host a network namespace of its own).
const wireEnv = "GOROVOD_FAKE_NODES_IF"

// Under scripts/fake-nodes/mpirun.sh the machines are network namespaces joined by veth pairs: the
// bytes of an allreduce between hosts must leave each host through its interface, whose address is
// in 198.18.0.0/15, and not through a loopback every host shares. The reference is the kernel's
// count of bytes the interface sent (/proc/net/dev is the reading process's network namespace's).
func TestAllreduceCrossesTheWire(t *testing.T) {
	ifname := os.Getenv(wireEnv)
	if ifname == "" || !underMPI() {
		t.Skipf("%s is unset: not on machines with a network stack each (make test-multinode)", wireEnv)
	}
	iface, err := net.InterfaceByName(ifname)
	if err != nil {
		t.Fatalf("%s=%s: %v", wireEnv, ifname, err)
	}
	addrs, err := iface.Addrs()
	if err != nil {
		t.Fatal(err)
	}
	_, benchNet, _ := net.ParseCIDR("198.18.0.0/15")
	for _, a := range addrs {
		if ip, _, err := net.ParseCIDR(a.String()); err != nil || !benchNet.Contains(ip) {
			t.Errorf("%s has address %s, outside 198.18.0.0/15", ifname, a)
		}
	}
	if len(addrs) == 0 {
		t.Errorf("%s has no address", ifname)
	}
	if len(ranksPerHost(hosts)) < 2 {
		t.Skipf("every rank on host %s: nothing crosses the wire", hosts[0])
	}
	const n = 4 << 20 // float32 elements: 16 MiB
	before := sentBytes(t, ifname)
	if err := hvd.Barrier(); err != nil {
		t.Fatal(err)
	}
	in := tensor(backend.Float32, []int{n}, make([]float64, n))
	if _, err := hvd.Allreduce("wire", in, horovod.AllreduceOptions{Op: horovod.Sum}); err != nil {
		t.Fatal(err)
	}
	if err := hvd.Barrier(); err != nil {
		t.Fatal(err)
	}
	// Whatever the algorithm, the other hosts cannot sum this host's data unless it leaves the
	// host: ring, recursive halving and Rabenseifner send at least half of it per host.
	if sent := sentBytes(t, ifname) - before; sent < 4*n/2 {
		t.Errorf("host %s sent %d bytes on %s during a %d-byte allreduce over %d hosts, want at least %d",
			hosts[hvd.Rank()], sent, ifname, 4*n, len(ranksPerHost(hosts)), 4*n/2)
	}
}

// sentBytes is the count of bytes interface ifname has sent, from /proc/net/dev.
func sentBytes(t *testing.T, ifname string) int64 {
	t.Helper()
	f, err := os.Open("/proc/net/dev")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	s := bufio.NewScanner(f)
	for s.Scan() {
		name, counters, ok := strings.Cut(s.Text(), ":")
		if !ok || strings.TrimSpace(name) != ifname {
			continue
		}
		// receive: bytes packets errs drop fifo frame compressed multicast; transmit: bytes ...
		fields := strings.Fields(counters)
		if len(fields) < 9 {
			break
		}
		n, err := strconv.ParseInt(fields[8], 10, 64)
		if err != nil {
			t.Fatalf("/proc/net/dev, %s: %v", ifname, err)
		}
		return n
	}
	t.Fatalf("/proc/net/dev has no interface %s (%v)", ifname, s.Err())
	return 0
}
