package conformance

import (
	"fmt"
	"maps"
	"os"
	"strconv"
	"strings"
	"testing"

	"github.com/gorovod/gorovod/horovod/backend"
)

// Horovod's topology comes from MPI's view of the machines (the world split by shared memory,
// then by local rank). The references are the hostname each rank sees, gathered with raw MPI,
// and the launcher's variables (OpenMPI's, or Slurm's under srun). Under scripts/fake-nodes/mpirun.sh (make test-multinode) the
// hostnames must also be the simulated layout it announces in GOROVOD_FAKE_NODES (as many ranks
// on each host as it has slots, in any order), so that a job that ran every rank on one host
// cannot pass for a multi-machine one.
func TestTopologyMatchesLauncher(t *testing.T) {
	got := backend.Topology{Rank: hvd.Rank(), Size: hvd.Size(), LocalRank: hvd.LocalRank(),
		LocalSize: hvd.LocalSize(), CrossRank: hvd.CrossRank(), CrossSize: hvd.CrossSize()}
	if !underMPI() {
		if want := (backend.Topology{Size: 1, LocalSize: 1, CrossSize: 1}); got != want {
			t.Fatalf("without a launcher: %+v, want %+v", got, want)
		}
		return
	}
	if want := topologyOfHosts(hosts, hvd.Rank()); got != want {
		t.Errorf("rank %d on host %s of %q: horovod says %+v, want %+v", hvd.Rank(), hosts[hvd.Rank()], hosts, got, want)
	}
	launcherVars := map[string]int{
		"OMPI_COMM_WORLD_RANK": hvd.Rank(), "OMPI_COMM_WORLD_SIZE": hvd.Size(),
		"OMPI_COMM_WORLD_LOCAL_RANK": hvd.LocalRank(), "OMPI_COMM_WORLD_LOCAL_SIZE": hvd.LocalSize(),
	}
	if underSrun() {
		// Slurm's node index is the cross rank when the tasks are dealt in blocks (srun's default
		// with -n and -N) and no node has more tasks than one before it, as in its layouts.
		launcherVars = map[string]int{
			"SLURM_PROCID": hvd.Rank(), "SLURM_STEP_NUM_TASKS": hvd.Size(),
			"SLURM_LOCALID": hvd.LocalRank(), "SLURM_NODEID": hvd.CrossRank(),
		}
	}
	for v, got := range launcherVars {
		if want, err := strconv.Atoi(os.Getenv(v)); err != nil || got != want {
			t.Errorf("%s=%q but horovod says %d", v, os.Getenv(v), got)
		}
	}
	if layout := os.Getenv("GOROVOD_FAKE_NODES"); layout != "" {
		want, err := slotsOfLayout(layout)
		if err != nil {
			t.Fatal(err)
		}
		if got := ranksPerHost(hosts); !maps.Equal(got, want) {
			t.Errorf("the ranks ran on hosts %q, but GOROVOD_FAKE_NODES=%s has slots %v", hosts, layout, want)
		}
	}
}

// topologyOfHosts is Horovod's topology of rank when each rank r runs on hosts[r]: its local rank
// is its index among the ranks of its host, its cross rank its index among the ranks of its local
// rank (one per host), both in rank order.
func topologyOfHosts(hosts []string, rank int) backend.Topology {
	localRank := func(r int) int {
		n := 0
		for q := range r {
			if hosts[q] == hosts[r] {
				n++
			}
		}
		return n
	}
	t := backend.Topology{Rank: rank, Size: len(hosts), LocalRank: localRank(rank)}
	for r, h := range hosts {
		if h == hosts[rank] {
			t.LocalSize++
		}
		if localRank(r) == t.LocalRank {
			t.CrossSize++
			if r < rank {
				t.CrossRank++
			}
		}
	}
	return t
}

// slotsOfLayout is the number of slots of each host of mpirun.sh's layout
// HOST:SLOTS[,HOST:SLOTS...].
func slotsOfLayout(layout string) (map[string]int, error) {
	slots := map[string]int{}
	for node := range strings.SplitSeq(layout, ",") {
		host, count, _ := strings.Cut(node, ":")
		n, err := strconv.Atoi(count)
		if host == "" || err != nil || n < 1 || slots[host] != 0 {
			return nil, fmt.Errorf("GOROVOD_FAKE_NODES=%s: bad host %q, want distinct HOST:SLOTS", layout, node)
		}
		slots[host] = n
	}
	return slots, nil
}

func ranksPerHost(hosts []string) map[string]int {
	n := map[string]int{}
	for _, h := range hosts {
		n[h]++
	}
	return n
}

// The reference itself, on layouts whose topology is known by heart (Horovod's definitions).
func TestTopologyOfHosts(t *testing.T) {
	for _, c := range []struct {
		hosts []string
		want  [][6]int // by rank: rank, size, local rank, local size, cross rank, cross size
	}{
		{[]string{"a"}, [][6]int{{0, 1, 0, 1, 0, 1}}},
		{[]string{"a", "a", "b", "b"}, [][6]int{{0, 4, 0, 2, 0, 2}, {1, 4, 1, 2, 0, 2}, {2, 4, 0, 2, 1, 2}, {3, 4, 1, 2, 1, 2}}},
		// Uneven: only host a runs a local rank 1, so that rank's cross communicator is itself.
		{[]string{"a", "a", "b"}, [][6]int{{0, 3, 0, 2, 0, 2}, {1, 3, 1, 2, 0, 1}, {2, 3, 0, 1, 1, 2}}},
		// Ranks interleaved over the hosts (mpirun --map-by node).
		{[]string{"a", "b", "a", "b"}, [][6]int{{0, 4, 0, 2, 0, 2}, {1, 4, 0, 2, 1, 2}, {2, 4, 1, 2, 0, 2}, {3, 4, 1, 2, 1, 2}}},
	} {
		for r, w := range c.want {
			want := backend.Topology{Rank: w[0], Size: w[1], LocalRank: w[2], LocalSize: w[3], CrossRank: w[4], CrossSize: w[5]}
			if got := topologyOfHosts(c.hosts, r); got != want {
				t.Errorf("hosts %q, rank %d: %+v, want %+v", c.hosts, r, got, want)
			}
		}
	}
	got, err := slotsOfLayout("nodea:2,nodeb:1")
	if want := map[string]int{"nodea": 2, "nodeb": 1}; err != nil || !maps.Equal(got, want) {
		t.Errorf("slotsOfLayout(nodea:2,nodeb:1) = %v, %v; want %v", got, err, want)
	}
	for _, bad := range []string{"nodea", "nodea:0", ":2", "nodea:2,", "nodea:1,nodea:1"} {
		if _, err := slotsOfLayout(bad); err == nil {
			t.Errorf("slotsOfLayout(%q) accepted", bad)
		}
	}
}
