package conformance

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"slices"
	"strconv"
	"sync"
	"testing"

	"github.com/gorovod/gorovod/horovod"
	"github.com/gorovod/gorovod/horovod/backend"
	"github.com/gorovod/gorovod/horovod/internal/rawmpi"
	"github.com/gorovod/gorovod/horovod/mpi"
)

// processSetsOn tells whether the job runs with process sets allowed (make test-mpi runs the
// suite once so).
func processSetsOn() bool {
	s, err := horovod.ReadSettings(os.LookupEnv)
	return err == nil && s.DynamicProcessSets
}

// processSetMembers is the set the suite adds: the first and the last rank.
func processSetMembers(size int) []int {
	if size == 1 {
		return []int{0}
	}
	return []int{0, size - 1}
}

// rawSets holds MPI_Allreduce's results for rawInput among processSetMembers, on a communicator
// raw MPI splits off itself, by "dtype/op"; computed before horovod starts.
var rawSets map[string][]byte

func rawProcessSetReferences(comm *mpi.Comm) error {
	if !processSetsOn() {
		return nil
	}
	rawSets = map[string][]byte{}
	t := comm.Topology()
	member := slices.Contains(processSetMembers(t.Size), t.Rank)
	var err error
	for _, c := range processSetCases {
		in := rawInput(c.dt, t.Rank, rawN)
		out := make([]byte, len(in))
		comm.Do(func() { err = rawmpi.SubsetAllreduce(member, in, out, c.dt, c.raw) })
		if err != nil {
			return err
		}
		rawSets[c.key()] = out
	}
	return nil
}

// processSetCases are the allreduces a set checks against raw MPI.
var processSetCases = []reduceCase{
	{backend.Int32, horovod.Sum, backend.Sum}, {backend.Int32, horovod.Product, backend.Product},
	{backend.Float64, horovod.Max, backend.Max}, {backend.Float64, horovod.Sum, backend.Sum},
}

// reduceCase is an allreduce: its dtype, its op, and the op raw MPI makes of it.
type reduceCase struct {
	dt  backend.DType
	op  horovod.ReduceOp
	raw backend.ReduceOp
}

// key is the case's entry in raw and rawSets.
func (c reduceCase) key() string { return c.dt.String() + "/" + c.raw.String() }

func (c reduceCase) input(rank int) horovod.Tensor {
	return horovod.Tensor{DType: c.dt, Shape: []int{rawN}, Data: rawInput(c.dt, rank, rawN)}
}

// A process set's allreduces give, on its members, the bytes raw MPI's allreduce among the same
// ranks gives, while the job's allreduces run at the same time on every rank and give the whole
// job's; the set's other collectives give what its members alone contributed; its Shutdown ends
// it on its members, and the job goes on.
func TestProcessSets(t *testing.T) {
	if !processSetsOn() {
		t.Skip("process sets are off: make test-mpi runs this with HOROVOD_DYNAMIC_PROCESS_SETS=1")
	}
	members := processSetMembers(hvd.Size())
	set, err := hvd.AddProcessSet(members)
	if err != nil {
		t.Fatal(err)
	}
	if member := slices.Contains(members, hvd.Rank()); (set != nil) != member {
		t.Fatalf("rank %d: a set %v, a member %v", hvd.Rank(), set != nil, member)
	}
	var wg sync.WaitGroup
	errs := make([]error, 2)
	wg.Go(func() { errs[0] = jobAllreduces() })
	if set != nil {
		wg.Go(func() { errs[1] = setCollectives(set, members) })
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		t.Fatal(err)
	}
	if set != nil {
		if err := set.Shutdown(); err != nil {
			t.Fatal(err)
		}
	}
	if err := jobAllreduces(); err != nil {
		t.Fatalf("after the set's shutdown: %v", err)
	}
}

// jobAllreduces checks the job's allreduces against raw MPI's over the whole job.
func jobAllreduces() error {
	for range 20 {
		for _, c := range processSetCases {
			got, err := hvd.Allreduce("process sets/job/"+c.key(), c.input(hvd.Rank()), horovod.AllreduceOptions{Op: c.op})
			if err != nil {
				return err
			}
			if !bytes.Equal(got.Data, raw[c.key()]) {
				return fmt.Errorf("the job's %s allreduce beside a process set's differs from MPI_Allreduce's", c.key())
			}
		}
	}
	return nil
}

// setCollectives checks a set's topology and collectives on one of its members.
func setCollectives(set *horovod.Horovod, members []int) error {
	rank := members[set.Rank()]
	// The set's topology is the job's among its members: local among members on one host.
	memberHosts := make([]string, len(members))
	for i, m := range members {
		memberHosts[i] = hosts[m]
	}
	topo := backend.Topology{Rank: set.Rank(), Size: set.Size(), LocalRank: set.LocalRank(),
		LocalSize: set.LocalSize(), CrossRank: set.CrossRank(), CrossSize: set.CrossSize()}
	if want := topologyOfHosts(memberHosts, slices.Index(members, rank)); topo != want || !slices.Equal(set.ProcessSetRanks(), members) {
		return fmt.Errorf("rank %d on hosts %q: a set of %v with topology %+v, want %+v", rank, memberHosts, set.ProcessSetRanks(), topo, want)
	}
	for range 20 {
		for _, c := range processSetCases {
			got, err := set.Allreduce("process sets/set/"+c.key(), c.input(rank), horovod.AllreduceOptions{Op: c.op})
			if err != nil {
				return err
			}
			if !bytes.Equal(got.Data, rawSets[c.key()]) {
				return fmt.Errorf("rank %d: the set's %s allreduce differs from MPI_Allreduce's among ranks %v", rank, c.key(), members)
			}
		}
	}
	root := set.Size() - 1
	b, _ := horovod.NewTensor([]int{1}, []int64{int64(rank)})
	got, err := set.Broadcast("process sets/broadcast", b, root)
	if err != nil {
		return err
	}
	if v, _ := horovod.Values[int64](got); v[0] != int64(members[root]) {
		return fmt.Errorf("rank %d: the set's broadcast from its rank %d gave %v, want job rank %d's", rank, root, v, members[root])
	}
	g, _ := horovod.NewTensor([]int{1}, []int32{int32(rank)})
	got, err = set.Allgather("process sets/allgather", g)
	if err != nil {
		return err
	}
	want := make([]int32, len(members))
	for i, m := range members {
		want[i] = int32(m)
	}
	if v, _ := horovod.Values[int32](got); !slices.Equal(v, want) {
		return fmt.Errorf("rank %d: the set's allgather gave %v, want %v", rank, v, want)
	}
	return set.Barrier()
}

// initSetsEnv is set by make test-mpi for a job that gives Init its process sets
// (horovod.WithProcessSets) without HOROVOD_DYNAMIC_PROCESS_SETS. TestMain then leaves Init to
// TestProcessSetsGivenToInit, the only test such a job runs.
const initSetsEnv = "GOROVOD_CONFORMANCE_INIT_SETS"

// Sets given to Init open MPI for process sets through the launcher's path (MPI_THREAD_MULTIPLE,
// or the split would refuse and Init fail): each set's integer sums are its members' alone,
// computed while the job's allreduce runs, and the sets end with the job's Shutdown.
func TestProcessSetsGivenToInit(t *testing.T) {
	if os.Getenv(initSetsEnv) == "" {
		t.Skip("run by make test-mpi, as a job of its own")
	}
	rank, err := strconv.Atoi(os.Getenv("OMPI_COMM_WORLD_RANK"))
	if err != nil {
		t.Fatalf("needs mpirun: %v", err)
	}
	size, _ := strconv.Atoi(os.Getenv("OMPI_COMM_WORLD_SIZE"))
	all := make([]int, size)
	for r := range all {
		all[r] = r
	}
	members := [][]int{processSetMembers(size), all}
	h, err := horovod.Init(horovod.WithProcessSets(members...))
	if err != nil {
		t.Fatalf("rank %d: %v", rank, err)
	}
	defer func() {
		if err := h.Shutdown(); err != nil {
			t.Error(err)
		}
	}()
	sum := func(h *horovod.Horovod, ranks []int) error {
		for i := range 20 {
			x, _ := horovod.NewTensor([]int{2}, []int32{int32(rank + 1), int32(i)})
			got, err := h.Allreduce(fmt.Sprintf("init sets/%v", ranks), x, horovod.AllreduceOptions{Op: horovod.Sum})
			if err != nil {
				return err
			}
			want := []int32{0, int32(i * len(ranks))}
			for _, r := range ranks {
				want[0] += int32(r + 1)
			}
			if v, _ := horovod.Values[int32](got); !slices.Equal(v, want) {
				return fmt.Errorf("rank %d: allreduce among %v gave %v, want %v", rank, ranks, v, want)
			}
		}
		return nil
	}
	sets := h.ProcessSets()
	var wg sync.WaitGroup
	errs := make([]error, 1+len(members))
	wg.Go(func() { errs[0] = sum(h, all) })
	for i, m := range members {
		if (sets[i] != nil) != slices.Contains(m, rank) {
			t.Fatalf("rank %d: set %v is %v", rank, m, sets[i])
		}
		if sets[i] != nil {
			wg.Go(func() { errs[i+1] = sum(sets[i], m) })
		}
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		t.Fatal(err)
	}
}
