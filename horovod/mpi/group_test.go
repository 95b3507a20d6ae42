package mpi

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"os"
	"runtime"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/gorovod/gorovod/horovod/backend"
)

// needProcessSets skips a test of Split unless comm was opened for process sets.
func needProcessSets(t *testing.T) backend.Topology {
	t.Helper()
	topo := need(t)
	if !processSets {
		t.Skip("Split needs MPI_THREAD_MULTIPLE: run with GOROVOD_MPI_TEST_PROCESS_SETS=1 (make test-mpi's second run)")
	}
	return topo
}

// splitCase is a process set a test splits, by name.
type splitCase struct {
	name  string
	ranks []int
}

// splitCases are the process sets the tests split, in an order every rank iterates alike: the
// first and last rank (one rank in a job of 1), one rank, and every rank.
func splitCases(size int) []splitCase {
	return []splitCase{
		{"ends", slices.Compact([]int{0, size - 1})},
		{"one", []int{size / 2}},
		{"all", ranksUpTo(size)},
	}
}

// split splits comm into ranks and checks what this rank gets: nil outside ranks, a Group whose
// Topology is this rank's place among them inside. A wrong Topology is an error, not a fatal
// one: the Group's other members, whose Topology may be right, go on with its collectives.
func split(t *testing.T, ranks []int) *Group {
	t.Helper()
	world := comm.Topology()
	b, err := comm.Split(ranks)
	if err != nil {
		t.Fatalf("Split(%v): %v", ranks, err)
	}
	at := slices.Index(ranks, world.Rank)
	if at < 0 {
		if b != nil {
			t.Fatalf("Split(%v) on rank %d, not among them: %v, want nil", ranks, world.Rank, b)
		}
		return nil
	}
	g, ok := b.(*Group)
	if !ok {
		t.Fatalf("Split(%v) on rank %d: %T, want a *Group", ranks, world.Rank, b)
	}
	// A Group is plain MPI: none of the Comm's ways that need its thread, its roll call's state
	// or its shared memory.
	for name, has := range map[string]bool{
		"ThreadBound":           implements[backend.ThreadBound](b),
		"RollCall":              implements[backend.RollCall](b),
		"HostAllocator":         implements[backend.HostAllocator](b),
		"PathReporter":          implements[backend.PathReporter](b),
		"PeerProber":            implements[backend.PeerProber](b),
		"OverlappedBroadcaster": implements[backend.OverlappedBroadcaster](b),
	} {
		if has {
			t.Errorf("a Group implements backend.%s", name)
		}
	}
	want := backend.Topology{Rank: at, Size: len(ranks), LocalRank: at, LocalSize: len(ranks), CrossRank: 0, CrossSize: 1}
	got := g.Topology()
	if world.LocalSize != world.Size {
		// On several machines only the set's own place is known here.
		want.LocalRank, want.LocalSize, want.CrossRank, want.CrossSize = got.LocalRank, got.LocalSize, got.CrossRank, got.CrossSize
	}
	if got != want || g.Name() != "mpi" {
		t.Errorf("Split(%v) on rank %d: %s with topology %+v, want mpi with %+v", ranks, world.Rank, g.Name(), got, want)
	}
	return g
}

// implements reports whether b implements the interface I.
func implements[I any](b backend.Backend) bool {
	_, ok := b.(I)
	return ok
}

// closeGroup closes g and checks that a second Close, and a call after Close, are ErrClosed.
func closeGroup(t *testing.T, g *Group) {
	t.Helper()
	if err := g.Close(); err != nil {
		t.Fatalf("Close: %v", err)
	}
	if err := g.Close(); !errors.Is(err, ErrClosed) {
		t.Errorf("a second Close: %v, want ErrClosed", err)
	}
	if err := g.Barrier(); !errors.Is(err, ErrClosed) {
		t.Errorf("Barrier after Close: %v, want ErrClosed", err)
	}
}

// TestSplitNeedsProcessSets: a Comm opened without ProcessSets (MPI_THREAD_SERIALIZED) refuses
// to split, naming the setting, before any MPI call.
func TestSplitNeedsProcessSets(t *testing.T) {
	topo := need(t)
	if processSets {
		t.Skip("comm was opened for process sets (GOROVOD_MPI_TEST_PROCESS_SETS=1)")
	}
	b, err := comm.Split(ranksUpTo(topo.Size))
	if b != nil || !errors.Is(err, backend.ErrCannotSplit) || !strings.Contains(err.Error(), "HOROVOD_DYNAMIC_PROCESS_SETS=1") || !strings.Contains(err.Error(), "MPI_THREAD_MULTIPLE") {
		t.Errorf("Split without process sets: %v, %v", b, err)
	}
	if mpiErr := (*Error)(nil); errors.As(err, &mpiErr) {
		t.Errorf("Split without process sets: %v, from MPI instead of before it", err)
	}
	if err := comm.Barrier(); err != nil {
		t.Fatal(err)
	}
}

// TestSplitMisuse: ranks against backend.Splitter's contract are an error before any MPI call,
// whatever the thread level.
func TestSplitMisuse(t *testing.T) {
	topo := need(t)
	for _, ranks := range [][]int{nil, {}, {-1}, {topo.Size}, {0, 0}, {topo.Size - 1, 0}, {0, topo.Size}} {
		b, err := comm.Split(ranks)
		if b != nil || err == nil || !strings.HasPrefix(err.Error(), "mpi: split of ") {
			t.Errorf("Split(%v): %v, %v", ranks, b, err)
		}
	}
	if err := comm.Barrier(); err != nil {
		t.Fatal(err)
	}
}

// TestSplitCollectives: on each split, the members' every collective gives what their inputs,
// known here by their ranks in the job, make; a rank not in the set makes none.
func TestSplitCollectives(t *testing.T) {
	needProcessSets(t)
	for _, c := range splitCases(comm.Topology().Size) {
		t.Run(c.name, func(t *testing.T) {
			if g := split(t, c.ranks); g != nil {
				checkGroupCollectives(t, g, c.ranks)
				closeGroup(t, g)
			}
			if err := comm.Barrier(); err != nil {
				t.Fatal(err)
			}
		})
	}
}

// checkGroupCollectives makes every collective of g, whose rank i is rank ranks[i] of the job.
func checkGroupCollectives(t *testing.T, g *Group, ranks []int) {
	t.Helper()
	me, n := g.Topology().Rank, len(ranks)

	// Allreduce, float and integer, an op where members' inputs add up and one where they
	// compete, and a float32 sum long enough for two calls where every member is on this machine.
	for _, ec := range []elementCodec{elementCodecs[0], elementCodecs[2]} {
		for _, c := range []struct {
			op       backend.ReduceOp
			elements int
		}{{backend.Sum, 1000}, {backend.Max, 1000}, {backend.Sum, SharedMemoryAllreduceChunk/4 + 3}} {
			if c.elements > 1000 && ec.dt != backend.Float32 {
				continue
			}
			es := ec.dt.Size()
			in, out := make([]byte, c.elements*es), make([]byte, c.elements*es)
			for i := range c.elements {
				ec.encode(in[i*es:], reduceScatterInput(ranks[me], i))
			}
			calls := g.allreduceCalls.Load()
			if err := g.Allreduce(in, out, ec.dt, c.op); err != nil {
				t.Fatalf("%v %v allreduce: %v", ec.dt, c.op, err)
			}
			for i := range c.elements {
				if got, want := ec.decode(out[i*es:]), reduceScatterWant(ranks, i, c.op); got != want {
					t.Fatalf("%v %v allreduce of %d elements: element %d is %v, want %v", ec.dt, c.op, c.elements, i, got, want)
				}
			}
			want := uint64(1)
			if g.Topology().LocalSize == n {
				want = uint64((len(in) + SharedMemoryAllreduceChunk - 1) / SharedMemoryAllreduceChunk)
			}
			if got := g.allreduceCalls.Load() - calls; got != want {
				t.Errorf("%v allreduce of %d bytes: %d MPI_Allreduce calls, want %d", ec.dt, len(in), got, want)
			}
		}
	}

	for root := range n {
		buf := bytes.Repeat([]byte{byte(ranks[me] + 1)}, 77)
		if err := g.Broadcast(buf, root); err != nil {
			t.Fatal(err)
		}
		if want := bytes.Repeat([]byte{byte(ranks[root] + 1)}, 77); !bytes.Equal(buf, want) {
			t.Fatalf("broadcast from the set's rank %d (the job's %d): got %v", root, ranks[root], buf[:4])
		}
	}

	// Allgathers: parts that differ by member, the first member's empty, and parts all present;
	// below and above SleepingWaitMaxPart, where the negotiation's waits differ; both waits.
	defer func(w backend.Wait) { g.wait = w }(g.wait)
	gathers := []struct {
		name   string
		wait   backend.Wait
		gather func(send, recv []byte, counts []int) error
	}{
		{"Allgatherv", backend.WaitSleep, g.Allgatherv},
		{"NegotiationAllgatherv, sleeping", backend.WaitSleep, g.NegotiationAllgatherv},
		{"NegotiationAllgatherv, spinning", backend.WaitSpin, g.NegotiationAllgatherv},
	}
	for _, a := range gathers {
		g.wait = a.wait
		for _, scale := range []int{1, SleepingWaitMaxPart} {
			for _, part := range []func(i int) int{
				func(i int) int { return i * (ranks[i] + 2) },
				func(i int) int { return ranks[i] + 1 },
			} {
				counts := make([]int, n)
				var want []byte
				for i := range counts {
					counts[i] = part(i) * scale
					want = append(want, bytes.Repeat([]byte{byte(ranks[i] + 1)}, counts[i])...)
				}
				send := bytes.Repeat([]byte{byte(ranks[me] + 1)}, counts[me])
				recv := make([]byte, len(want))
				if err := a.gather(send, recv, counts); err != nil {
					t.Fatalf("%s, counts %v: %v", a.name, counts, err)
				}
				if !bytes.Equal(recv, want) {
					t.Fatalf("%s, counts %v: gathered the wrong bytes", a.name, counts)
				}
			}
		}
	}

	cases := reduceScatterCounts(n)
	for _, ec := range elementCodecs {
		for _, op := range []backend.ReduceOp{backend.Sum, backend.Min, backend.Max, backend.Product} {
			for _, name := range []string{"even", "uneven", "long", "empty"} {
				checkReduceScatter(t, g, ranks, ec, op, cases[name])
			}
		}
	}

	for _, idle := range []bool{false, true} {
		for _, scale := range []int{0, 1, 3, 40000} {
			var send, want []byte
			sendCounts, recvCounts := make([]int, n), make([]int, n)
			for i, r := range ranks {
				out, in := alltoallBlock(ranks[me], r, scale, idle), alltoallBlock(r, ranks[me], scale, idle)
				send, sendCounts[i] = append(send, out...), len(out)
				want, recvCounts[i] = append(want, in...), len(in)
			}
			recv := make([]byte, len(want))
			if err := g.Alltoallv(send, sendCounts, recv, recvCounts); err != nil {
				t.Fatalf("alltoallv, scale %d, idle %v: %v", scale, idle, err)
			}
			if !bytes.Equal(recv, want) {
				t.Fatalf("alltoallv, scale %d, idle %v, send counts %v, receive counts %v: received the wrong bytes", scale, idle, sendCounts, recvCounts)
			}
		}
	}

	if err := g.Barrier(); err != nil {
		t.Fatal(err)
	}
}

// TestGroupPastMPICounts: past one MPI call's counts (2^31-1, lowered here to 1000) a group goes
// the Comm's ways: an allgather as broadcasts, a reduce-scatter as an allreduce, and a
// negotiation round or an all-to-all block that long is an error before any MPI call.
func TestGroupPastMPICounts(t *testing.T) {
	topo := needProcessSets(t)
	ranks := splitCases(topo.Size)[0].ranks
	g := split(t, ranks)
	if g != nil {
		defer func(n int) { maxCount = n }(maxCount)
		maxCount = 1000
		n, me := len(ranks), g.Topology().Rank
		counts := make([]int, n)
		var want []byte
		for i := range counts {
			counts[i] = 1001 + ranks[i] // each past maxCount
			want = append(want, bytes.Repeat([]byte{byte(ranks[i] + 1)}, counts[i])...)
		}
		send := bytes.Repeat([]byte{byte(ranks[me] + 1)}, counts[me])
		recv := make([]byte, len(want))
		if err := g.Allgatherv(send, recv, counts); err != nil || !bytes.Equal(recv, want) {
			t.Errorf("allgather of parts %v past maxCount 1000: %v (right bytes: %v)", counts, err, bytes.Equal(recv, want))
		}
		if err := g.NegotiationAllgatherv(send, recv, counts); err == nil || !strings.Contains(err.Error(), "above 2^31-1") {
			t.Errorf("a negotiation round past the counts: %v", err)
		}
		for _, op := range []backend.ReduceOp{backend.Sum, backend.Max} {
			calls := g.allreduceCalls.Load()
			checkReduceScatter(t, g, ranks, elementCodecs[0], op, slices.Repeat([]int{1000/n + 1}, n))
			if g.allreduceCalls.Load() == calls {
				t.Errorf("%v reduce-scatter past maxCount: reduced without Allreduce", op)
			}
		}
		blocks := slices.Repeat([]int{1001}, n)
		err := g.Alltoallv(make([]byte, 1001*n), blocks, make([]byte, 1001*n), blocks)
		if err == nil || !strings.Contains(err.Error(), "at most 1000") {
			t.Errorf("alltoallv of blocks past maxCount 1000: %v", err)
		}
		closeGroup(t, g)
	}
	if err := comm.Barrier(); err != nil {
		t.Fatal(err)
	}
}

// TestGroupMisuseIsAnErrorBeforeMPI: a group's collectives check their arguments as the Comm's
// do, before any MPI call (every member passes the same ones here).
func TestGroupMisuseIsAnErrorBeforeMPI(t *testing.T) {
	topo := needProcessSets(t)
	g := split(t, ranksUpTo(topo.Size))
	n := topo.Size
	even := slices.Repeat([]int{8}, n)
	buf := make([]byte, 8*n+8)
	send, recv := buf[:8*n], buf[8*n:]
	mine := 8 * topo.Rank
	for _, c := range []struct {
		name string
		err  error
	}{
		{"allreduce, invalid dtype", g.Allreduce(make([]byte, 4), make([]byte, 4), backend.DType(0), backend.Sum)},
		{"allreduce, lengths differ", g.Allreduce(make([]byte, 4), make([]byte, 8), backend.Float32, backend.Sum)},
		{"allreduce, part of an element", g.Allreduce(make([]byte, 6), make([]byte, 6), backend.Float32, backend.Sum)},
		{"broadcast, root past the last", g.Broadcast(make([]byte, 4), n)},
		{"broadcast, negative root", g.Broadcast(make([]byte, 4), -1)},
		{"allgatherv, counts for one more", g.Allgatherv(nil, nil, make([]int, n+1))},
		{"allgatherv, send off its count", g.Allgatherv(make([]byte, 4), make([]byte, 4*n), slices.Repeat([]int{5}, n))},
		{"negotiation, counts for one more", g.NegotiationAllgatherv(nil, nil, make([]int, n+1))},
		{"reduce-scatter, invalid op", g.ReduceScatter(send, recv, even, backend.Float32, backend.ReduceOp(0))},
		{"reduce-scatter, counts for one more", g.ReduceScatter(send, recv, append(slices.Clone(even), 8), backend.Float32, backend.Sum)},
		{"reduce-scatter, recv inside send", g.ReduceScatter(send, send[mine:mine+8], even, backend.Float32, backend.Sum)},
		{"alltoallv, too few send counts", g.Alltoallv(send, even[1:], make([]byte, len(send)), even)},
		{"alltoallv, the same buffer twice", g.Alltoallv(send, even, send, even)},
	} {
		if c.err == nil || !strings.HasPrefix(c.err.Error(), "mpi: ") {
			t.Errorf("%s: %v", c.name, c.err)
		}
		if mpiErr := (*Error)(nil); errors.As(c.err, &mpiErr) {
			t.Errorf("%s: %v, from MPI instead of the argument check", c.name, c.err)
		}
	}
	closeGroup(t, g)
}

// threadCPUHere is the CPU time the calling thread has used so far; the caller is locked to it.
func threadCPUHere(t *testing.T) time.Duration {
	t.Helper()
	used, err := threadTime()
	if err != nil {
		t.Fatal(err)
	}
	return used
}

// TestGroupNegotiationSleeps: a member early in a group's negotiation round waits for a late
// peer sleeping, leaving the core alone, where the Comm's would (WaitSleep, small parts), and
// every wait gathers the right bytes.
func TestGroupNegotiationSleeps(t *testing.T) {
	topo := needProcessSets(t)
	if topo.Size < 2 {
		t.Skip("needs a peer")
	}
	g := split(t, ranksUpTo(topo.Size))
	defer closeGroup(t, g)
	// The group's calls run on this goroutine's thread: measure that one.
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	checkLatePeer(t, topo, func(w backend.Wait) { g.wait = w }, g.NegotiationAllgatherv, threadCPUHere)
}

// TestGroupsRunAlongsideTheComm: on every rank the Comm, driven as horovod drives it (its calls
// in place under Serve), and two Groups, each on a goroutine of its own, make their collectives
// at the same time, every result right; the Groups' negotiation rounds leave the Comm's roll call
// alone. A deadlock fails the run instead of hanging it.
func TestGroupsRunAlongsideTheComm(t *testing.T) {
	topo := needProcessSets(t)
	cases := splitCases(topo.Size)
	all, ends := split(t, cases[2].ranks), split(t, cases[0].ranks)
	const rounds = 200
	rollCalls0, _ := comm.RollCalls()

	// loop makes rounds of an allreduce of float32 values and a negotiation round over b, whose
	// rank i is ranks[i] of the job, each checked against the members' inputs.
	loop := func(b backend.Backend, ranks []int, elements int) error {
		me := b.Topology().Rank
		sum := 0
		for _, r := range ranks {
			sum += r + 1
		}
		in, out := make([]byte, 4*elements), make([]byte, 4*elements)
		counts := slices.Repeat([]int{8}, len(ranks))
		gathered := make([]byte, 8*len(ranks))
		for k := range rounds {
			for i := range elements {
				binary.LittleEndian.PutUint32(in[4*i:], math.Float32bits(float32((ranks[me]+1)*(k+1)+i%7)))
			}
			if err := b.Allreduce(in, out, backend.Float32, backend.Sum); err != nil {
				return err
			}
			for i := range elements {
				if got, want := math.Float32frombits(binary.LittleEndian.Uint32(out[4*i:])), float32(sum*(k+1)+len(ranks)*(i%7)); got != want {
					return fmt.Errorf("round %d: element %d of the sum is %v, want %v", k, i, got, want)
				}
			}
			mine := binary.LittleEndian.AppendUint64(nil, uint64(ranks[me]*rounds+k))
			if err := backend.ControlAllgatherv(b, mine, gathered, counts); err != nil {
				return err
			}
			for i, r := range ranks {
				if got := binary.LittleEndian.Uint64(gathered[8*i:]); got != uint64(r*rounds+k) {
					return fmt.Errorf("round %d: negotiation part %d is %d, want %d", k, i, got, r*rounds+k)
				}
			}
		}
		return nil
	}

	var wg sync.WaitGroup
	var commErr, allErr, endsErr error
	wg.Go(func() {
		// Long enough for the Comm to go over shared memory where every rank is on this machine.
		comm.Serve(func() { commErr = loop(comm, cases[2].ranks, SharedAllreduceMinBytes/4) })
	})
	wg.Go(func() { allErr = loop(all, cases[2].ranks, 1000) })
	if ends != nil {
		wg.Go(func() { endsErr = loop(ends, cases[0].ranks, 100) })
	}
	done := make(chan struct{})
	go func() { wg.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(2 * time.Minute):
		fmt.Fprintln(os.Stderr, "FAIL: TestGroupsRunAlongsideTheComm: the Comm and its Groups have not finished in 2 minutes (deadlock?)")
		os.Exit(1)
	}
	for _, e := range []struct {
		name string
		err  error
	}{{"the Comm", commErr}, {"the group of every rank", allErr}, {"the group of the ends", endsErr}} {
		if e.err != nil {
			t.Errorf("%s: %v", e.name, e.err)
		}
	}
	if rollCalls, _ := comm.RollCalls(); rollCalls-rollCalls0 != rounds {
		t.Errorf("the Comm's roll call counted %d negotiation rounds, want its own %d", rollCalls-rollCalls0, rounds)
	}
	closeGroup(t, all)
	if ends != nil {
		closeGroup(t, ends)
	}
	if err := comm.Barrier(); err != nil {
		t.Fatal(err)
	}
}
