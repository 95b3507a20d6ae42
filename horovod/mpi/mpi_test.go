package mpi

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"os"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/gorovod/gorovod/horovod/backend"
	"github.com/gorovod/gorovod/horovod/bf16"
	"github.com/gorovod/gorovod/horovod/fp16"
)

// comm is the world communicator when the tests run under mpirun (mk/horovod.mk does that);
// without a launcher the tests skip: MPI singletons need no test of their own.
var comm *Comm

// processSets: comm was opened for process sets (MPI_THREAD_MULTIPLE), as make test-mpi's second
// run of the tests asks with GOROVOD_MPI_TEST_PROCESS_SETS=1; the Split tests need it, and the
// rest run under both thread levels.
var processSets = os.Getenv("GOROVOD_MPI_TEST_PROCESS_SETS") == "1"

func TestMain(m *testing.M) {
	if os.Getenv("OMPI_COMM_WORLD_SIZE") != "" {
		var err error
		if comm, err = Open(backend.DriverConfig{ProcessSets: processSets}); err != nil {
			panic(err)
		}
		if comm.shm != nil {
			// The tests stage Go memory from the shortest shared allreduce on, to cover the
			// staged path at every length; TestStagedAllreduceFromItsThreshold checks the
			// threshold itself.
			comm.shm.stagedMin = SharedAllreduceMinBytes
		}
	}
	code := m.Run()
	if comm != nil {
		// Close can be checked only here, after every test: MPI is initialized once a process.
		var open backend.Backend
		if processSets {
			var err error
			if open, err = comm.Split(ranksUpTo(comm.Topology().Size)); err != nil {
				fmt.Fprintln(os.Stderr, "FAIL: splitting a group to leave open:", err)
				code = 1
			}
		}
		if err := closeRacingDo(comm); err != nil {
			fmt.Fprintln(os.Stderr, "FAIL: closing the communicator:", err)
			code = 1
		}
		if open != nil {
			if err := checkClosedByParent(open); err != nil {
				fmt.Fprintln(os.Stderr, "FAIL: a group left open when the communicator closed:", err)
				code = 1
			}
		}
	}
	os.Exit(code)
}

// checkClosedByParent checks a Group left open while its Comm closed: the Comm freed it before
// finalizing MPI, so its calls and its Close return ErrClosed instead of calling MPI after
// MPI_Finalize (which aborts the process).
func checkClosedByParent(g backend.Backend) error {
	if err := g.Barrier(); !errors.Is(err, ErrClosed) {
		return fmt.Errorf("Barrier after the Comm's Close: %v, want ErrClosed", err)
	}
	if err := g.Close(); !errors.Is(err, ErrClosed) {
		return fmt.Errorf("Close after the Comm's Close: %v, want ErrClosed", err)
	}
	return nil
}

// closeRacingDo closes c twice at once while calls race the closes: exactly one Close finalizes
// MPI, the other returns ErrClosed, and each call either runs (before MPI_Finalize) or returns
// ErrClosed. A second MPI_Finalize, or an MPI call after the first, makes Open MPI abort the
// process; a call sent to the ended MPI thread would panic.
func closeRacingDo(c *Comm) error {
	const callers = 8
	var wg sync.WaitGroup
	closeErrs := make([]error, 2)
	callErrs := make([]error, callers)
	for i := range closeErrs {
		wg.Go(func() { closeErrs[i] = c.Close() })
	}
	for i := range callErrs {
		wg.Go(func() { callErrs[i] = c.Do(func() {}) })
	}
	wg.Wait()
	if !(closeErrs[0] == nil && errors.Is(closeErrs[1], ErrClosed) || closeErrs[1] == nil && errors.Is(closeErrs[0], ErrClosed)) {
		return fmt.Errorf("two Close calls at once returned %v and %v, want nil and ErrClosed", closeErrs[0], closeErrs[1])
	}
	for _, err := range callErrs {
		if err != nil && !errors.Is(err, ErrClosed) {
			return fmt.Errorf("Do racing Close: %v, want nil or ErrClosed", err)
		}
	}
	if err := c.Do(func() {}); !errors.Is(err, ErrClosed) {
		return fmt.Errorf("Do after Close: %v, want ErrClosed", err)
	}
	return nil
}

func need(t *testing.T) backend.Topology {
	t.Helper()
	if comm == nil {
		t.Skip("needs mpirun (make test-mpi)")
	}
	return comm.Topology()
}

// sixteenBit is one 16-bit float type's conversions from and to float32.
type sixteenBit struct {
	dt     backend.DType
	narrow func(float32) uint16
	widen  func(uint16) float32
}

var sixteenBits = []sixteenBit{{backend.Float16, fp16.FromFloat32, fp16.ToFloat32}, {backend.BFloat16, bf16.FromFloat32, bf16.ToFloat32}}

func (f sixteenBit) encode(vals ...float32) []byte {
	b := make([]byte, 2*len(vals))
	for i, v := range vals {
		binary.LittleEndian.PutUint16(b[2*i:], f.narrow(v))
	}
	return b
}

func (f sixteenBit) decode(b []byte) []float32 {
	out := make([]float32, len(b)/2)
	for i := range out {
		out[i] = f.widen(binary.LittleEndian.Uint16(b[2*i:]))
	}
	return out
}

// TestSixteenBitOperators: with up to 3 ranks (make test-mpi runs 2 and 3), every value and
// partial result below is exact in both float16 and bfloat16 (at most 8 significant bits), so
// the results are compared exactly. The last element is 2^17
// per rank: beyond float16's range (infinity), within bfloat16's.
func TestSixteenBitOperators(t *testing.T) {
	topo := need(t)
	for _, f := range sixteenBits {
		t.Run(f.dt.String(), func(t *testing.T) { testSixteenBitOperators(t, topo, f) })
	}
}

func testSixteenBitOperators(t *testing.T, topo backend.Topology, f sixteenBit) {
	r, n := float32(topo.Rank), float32(topo.Size)
	inf := float32(math.Inf(1))
	// Per element: a value per rank, and the sum, min, max and product over ranks.
	in := f.encode(r, -r*0.5, 96*r, 0.25, r)
	last := float32(0)
	if topo.Rank == topo.Size-1 {
		last = inf
	}
	in = append(in, f.encode(last, 1<<17)...)
	big := float32(1 << 17)
	if f.dt == backend.Float16 {
		big = inf
	}
	sum := []float32{n * (n - 1) / 2, -n * (n - 1) / 4, 96 * n * (n - 1) / 2, 0.25 * n, n * (n - 1) / 2, inf, big * n}
	lo := []float32{0, -(n - 1) * 0.5, 0, 0.25, 0, 0, big}
	hi := []float32{n - 1, 0, 96 * (n - 1), 0.25, n - 1, inf, big}
	prod := []float32{0, 0, 0, float32(math.Pow(0.25, float64(n))), 0, inf, float32(math.Pow(float64(big), float64(n)))}
	if n > 1 {
		prod[5] = float32(math.NaN()) // 0·inf
	}
	for _, c := range []struct {
		op   backend.ReduceOp
		want []float32
	}{{backend.Sum, sum}, {backend.Min, lo}, {backend.Max, hi}, {backend.Product, prod}} {
		out := make([]byte, len(in))
		if err := comm.Allreduce(in, out, f.dt, c.op); err != nil {
			t.Fatal(err)
		}
		got := f.decode(out)
		for i := range got {
			if got[i] != c.want[i] && !(math.IsNaN(float64(got[i])) && math.IsNaN(float64(c.want[i]))) {
				t.Errorf("%v: element %d is %v, want %v (all: %v)", c.op, i, got[i], c.want[i], got)
				break
			}
		}
	}
	// A NaN anywhere makes the sum NaN.
	nan := f.encode(0)
	if topo.Rank == 0 {
		nan = f.encode(float32(math.NaN()))
	}
	if err := comm.Allreduce(nan, nan, f.dt, backend.Sum); err != nil {
		t.Fatal(err)
	}
	if v := f.decode(nan)[0]; v == v {
		t.Errorf("sum with a NaN is %v", v)
	}
}

// TestByteSumsWrap: a sum of int8 or uint8 wraps around, as C's, TensorFlow's and NCCL's do,
// whether MPI reduces it (a short tensor) or shared memory does: OpenMPI 4.1's AVX operators
// saturate 8-bit sums instead (open-mpi/ompi#8045), which made a result depend on the length.
func TestByteSumsWrap(t *testing.T) {
	topo := need(t)
	for _, dt := range []backend.DType{backend.Int8, backend.Uint8} {
		for _, n := range []int{64, SharedAllreduceMinBytes + 64} {
			in := bytes.Repeat([]byte{100}, n) // 2 ranks sum past int8's 127
			if dt == backend.Uint8 {
				in = bytes.Repeat([]byte{200}, n) // and past uint8's 255
			}
			want := byte(int(in[0]) * topo.Size)
			out := make([]byte, n)
			if err := comm.Allreduce(in, out, dt, backend.Sum); err != nil {
				t.Fatal(err)
			}
			if bytes.Count(out, []byte{want}) != n {
				t.Errorf("%v sum of %d elements of %d over %d ranks: element 0 is %d, want %d (wrapped)", dt, n, in[0], topo.Size, out[0], want)
			}
		}
	}
}

func TestInPlaceAndOutOfPlaceAgree(t *testing.T) {
	topo := need(t)
	in := make([]byte, 8*1000)
	for i := 0; i < 1000; i++ {
		binary.LittleEndian.PutUint64(in[8*i:], uint64(i*topo.Size+topo.Rank))
	}
	out := make([]byte, len(in))
	if err := comm.Allreduce(in, out, backend.Int64, backend.Max); err != nil {
		t.Fatal(err)
	}
	if err := comm.Allreduce(in, in, backend.Int64, backend.Max); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(in, out) {
		t.Fatal("in-place and out-of-place allreduce differ")
	}
	for i := 0; i < 1000; i++ {
		if got := binary.LittleEndian.Uint64(out[8*i:]); got != uint64(i*topo.Size+topo.Size-1) {
			t.Fatalf("max[%d] = %d", i, got)
		}
	}
}

// TestLargeAllreduceGoesInChunks: on one machine an allreduce through MPI (here: with shared
// memory's staging off, as where it cannot be allocated) longer than SharedMemoryAllreduceChunk
// is several MPI calls, of whole elements (on several machines, one call), and still every
// element's reduction: int64 and float16 (MPI's built-in sum and horovod's own operator) of
// lengths that end mid-chunk, in place and not. The values are small integers, exact in any
// order of summation in both types.
func TestLargeAllreduceGoesInChunks(t *testing.T) {
	topo := need(t)
	if comm.shm != nil { // on one machine a sum goes over shared memory unless it cannot stage
		comm.shm.noStaging = true
		defer func() { comm.shm.noStaging = false }()
	}
	value := func(i int) int { return (i*7+topo.Rank*3)%11 - 5 }
	want := func(i int) int {
		sum := 0
		for r := range topo.Size {
			sum += (i*7+r*3)%11 - 5
		}
		return sum
	}
	f16 := sixteenBits[0]
	for _, c := range []struct {
		dt     backend.DType
		n      int // elements
		encode func(vals []int) []byte
		decode func(b []byte) []int
	}{
		{backend.Int64, 2*SharedMemoryAllreduceChunk/8 + 3, func(vals []int) []byte {
			b := make([]byte, 8*len(vals))
			for i, v := range vals {
				binary.LittleEndian.PutUint64(b[8*i:], uint64(v))
			}
			return b
		}, func(b []byte) []int {
			out := make([]int, len(b)/8)
			for i := range out {
				out[i] = int(int64(binary.LittleEndian.Uint64(b[8*i:])))
			}
			return out
		}},
		{backend.Float16, SharedMemoryAllreduceChunk/2 + 1, func(vals []int) []byte {
			fs := make([]float32, len(vals))
			for i, v := range vals {
				fs[i] = float32(v)
			}
			return f16.encode(fs...)
		}, func(b []byte) []int {
			fs := f16.decode(b)
			out := make([]int, len(fs))
			for i, v := range fs {
				out[i] = int(v)
			}
			return out
		}},
	} {
		calls := 1
		if topo.LocalSize == topo.Size {
			calls = (c.n*c.dt.Size() + SharedMemoryAllreduceChunk - 1) / SharedMemoryAllreduceChunk
		}
		vals := make([]int, c.n)
		for i := range vals {
			vals[i] = value(i)
		}
		for _, inPlace := range []bool{false, true} {
			in := c.encode(vals)
			out := in
			if !inPlace {
				out = make([]byte, len(in))
			}
			before := comm.AllreduceCalls()
			if err := comm.Allreduce(in, out, c.dt, backend.Sum); err != nil {
				t.Fatal(err)
			}
			if got := comm.AllreduceCalls() - before; got != uint64(calls) {
				t.Errorf("%v, %d elements (in place %v): %d MPI_Allreduce calls, want %d", c.dt, c.n, inPlace, got, calls)
			}
			for i, v := range c.decode(out) {
				if v != want(i) {
					t.Fatalf("%v, %d elements (in place %v): element %d is %d, want %d", c.dt, c.n, inPlace, i, v, want(i))
				}
			}
		}
	}
}

// allgathers are the Comm's two allgathers, the data's (blocking) and the negotiation's, in an
// order every rank iterates alike (each is a collective).
var allgathers = []struct {
	name   string
	gather func(send, recv []byte, counts []int) error
}{
	{"Allgatherv", func(send, recv []byte, counts []int) error { return comm.Allgatherv(send, recv, counts) }},
	{"NegotiationAllgatherv", func(send, recv []byte, counts []int) error {
		return comm.NegotiationAllgatherv(send, recv, counts)
	}},
}

func TestAllgathervWithEmptyRanks(t *testing.T) {
	topo := need(t)
	for _, a := range allgathers {
		// Parts below and above SleepingWaitMaxPart: the negotiation's waits differ there.
		for _, scale := range []int{1, SleepingWaitMaxPart} {
			counts := make([]int, topo.Size)
			var want []byte
			for r := range counts {
				counts[r] = (r % 2) * (r + 3) * scale // even ranks send nothing
				want = append(want, bytes.Repeat([]byte{byte(r)}, counts[r])...)
			}
			send := bytes.Repeat([]byte{byte(topo.Rank)}, counts[topo.Rank])
			recv := make([]byte, len(want))
			if err := a.gather(send, recv, counts); err != nil {
				t.Fatal(err)
			}
			if !bytes.Equal(recv, want) {
				t.Fatalf("%s, counts %v: gathered the wrong bytes", a.name, counts)
			}
		}
	}
}

// An allgather of more bytes in all than one MPI call counts (2^31-1, lowered here to 1000)
// goes as one broadcast of each rank's part, itself in calls of at most that many bytes: every
// rank gathers every part, with no error and no abort. A negotiation round that long is an
// error, on every rank alike, before any MPI call.
func TestAllgathervPastMPICounts(t *testing.T) {
	topo := need(t)
	defer func(n int) { maxCount = n }(maxCount)
	maxCount = 1000
	counts := make([]int, topo.Size)
	var want []byte
	for r := range counts {
		counts[r] = 700 * (r + 1) // past maxCount in all, and from the second rank on alone
		for i := range counts[r] {
			want = append(want, byte(r*31+i))
		}
	}
	off := 0
	for r := range topo.Rank {
		off += counts[r]
	}
	send := slices.Clone(want[off : off+counts[topo.Rank]])
	recv := make([]byte, len(want))
	if err := comm.Allgatherv(send, recv, counts); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(recv, want) {
		t.Fatalf("counts %v: gathered the wrong bytes", counts)
	}
	if err := comm.NegotiationAllgatherv(send, recv, counts); err == nil || !strings.Contains(err.Error(), "above 2^31-1") {
		t.Errorf("a negotiation round past the counts: %v", err)
	}
}

func TestBroadcastFromEveryRoot(t *testing.T) {
	topo := need(t)
	for root := 0; root < topo.Size; root++ {
		buf := bytes.Repeat([]byte{byte(topo.Rank + 1)}, 77)
		if err := comm.Broadcast(buf, root); err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(buf, bytes.Repeat([]byte{byte(root + 1)}, 77)) {
			t.Fatalf("root %d: got %v", root, buf[:4])
		}
	}
	if err := comm.Barrier(); err != nil {
		t.Fatal(err)
	}
}

func TestMisuseIsAnErrorBeforeMPI(t *testing.T) {
	topo := need(t)
	for _, err := range []error{
		comm.Allreduce(make([]byte, 4), make([]byte, 4), backend.DType(0), backend.Sum),
		comm.Allreduce(make([]byte, 4), make([]byte, 8), backend.Float32, backend.Sum),
		comm.Allreduce(make([]byte, 6), make([]byte, 6), backend.Float32, backend.Sum),
		comm.Broadcast(make([]byte, 4), topo.Size),
		comm.Allgatherv(nil, nil, []int{0}),
		comm.NegotiationAllgatherv(nil, nil, []int{0}),
		comm.Allgatherv(make([]byte, 4), make([]byte, 4*topo.Size), slices.Repeat([]int{5}, topo.Size)),
	} {
		if err == nil || !strings.HasPrefix(err.Error(), "mpi: ") {
			t.Errorf("misuse gave %v", err)
		}
	}
	if _, err := Open(backend.DriverConfig{}); err == nil {
		t.Error("a second Open succeeded")
	}
}

// threadCPU is the CPU time the MPI thread has used so far.
func threadCPU(t *testing.T) time.Duration {
	t.Helper()
	var used time.Duration
	var err error
	if derr := comm.Do(func() { used, err = threadTime() }); derr != nil {
		t.Fatal(derr)
	}
	if err != nil {
		t.Fatal(err)
	}
	return used
}

// threadTime is the CPU time the calling thread has used so far.
func threadTime() (time.Duration, error) {
	var ru syscall.Rusage
	err := syscall.Getrusage(syscall.RUSAGE_THREAD, &ru)
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano()), err
}

// TestNegotiationAllgathervWithALatePeer gathers while the last rank arrives late, as a negotiation round
// does while a peer computes: every wait (sleeping, MPI's blocking one, parts on either side of
// SleepingWaitMaxPart) gathers the right bytes, and the sleeping wait leaves the core alone.
func TestNegotiationAllgathervWithALatePeer(t *testing.T) {
	topo := need(t)
	if topo.Size < 2 {
		t.Skip("needs a peer")
	}
	defer func(w backend.Wait) { comm.wait = w }(comm.wait)
	checkLatePeer(t, topo, func(w backend.Wait) { comm.wait = w }, comm.NegotiationAllgatherv, threadCPU)
}

// checkLatePeer gathers with gather, under each wait set with setWait, while the last rank
// arrives late: the right bytes every time, and where the wait sleeps (WaitSleep, parts up to
// SleepingWaitMaxPart) the waiting ranks' MPI calls leave the core alone, by cpu, the CPU time
// of the thread making them.
func checkLatePeer(t *testing.T, topo backend.Topology, setWait func(backend.Wait), gather func(send, recv []byte, counts []int) error, cpu func(*testing.T) time.Duration) {
	t.Helper()
	const late = 200 * time.Millisecond
	for _, wait := range []backend.Wait{backend.WaitSleep, backend.WaitSpin} {
		setWait(wait)
		for _, part := range []int{16, SleepingWaitMaxPart, SleepingWaitMaxPart + 1} {
			counts := slices.Repeat([]int{part}, topo.Size)
			var want []byte
			for r := range counts {
				want = append(want, bytes.Repeat([]byte{byte(r + 1)}, part)...)
			}
			send := bytes.Repeat([]byte{byte(topo.Rank + 1)}, part)
			recv := make([]byte, len(want))
			if topo.Rank == topo.Size-1 {
				time.Sleep(late)
			}
			cpu0, wall0 := cpu(t), time.Now()
			if err := gather(send, recv, counts); err != nil {
				t.Fatal(err)
			}
			used, wall := cpu(t)-cpu0, time.Since(wall0)
			if !bytes.Equal(recv, want) {
				t.Fatalf("wait %v, parts of %d bytes: gathered the wrong bytes", wait, part)
			}
			if topo.Rank == topo.Size-1 || wall < late/2 {
				continue // not the one waiting (or the late rank was not late for this one)
			}
			t.Logf("wait %v, parts of %d bytes: waited %v using %v of CPU", wait, part, wall.Round(time.Millisecond), used.Round(time.Microsecond))
			// Polling takes all the CPU time the scheduler grants; the sleeping wait takes a few
			// microseconds per test, at most 2 tests per millisecond once its sleeps reach 0.5 ms.
			if wait == backend.WaitSleep && part <= SleepingWaitMaxPart && used > wall/4 {
				t.Errorf("parts of %d bytes: waiting %v for a late peer used %v of CPU: the wait polls", part, wall, used)
			}
		}
	}
}

// TestRollCallOnlyWhenARoundWaits: a round whose ranks arrive together sends no note, a rank
// that waits for a late peer takes the roll call, and a note left over from a round that its
// receiver did not wait in never counts for a later round.
func TestRollCallOnlyWhenARoundWaits(t *testing.T) {
	topo := need(t)
	if topo.Size < 2 {
		t.Skip("needs a peer")
	}
	last := topo.Size - 1
	counts := slices.Repeat([]int{8}, topo.Size)
	send, recv := make([]byte, 8), make([]byte, 8*topo.Size)
	gather := func() {
		t.Helper()
		if err := comm.NegotiationAllgatherv(send, recv, counts); err != nil {
			t.Fatal(err)
		}
	}

	// Round k: the last rank comes late; the others wait, so they call the roll, and rank 0's
	// note to the last rank stays unreceived (the last rank did not wait).
	_, before := comm.RollCalls()
	if topo.Rank == last {
		time.Sleep(100 * time.Millisecond)
	}
	gather()
	if _, after := comm.RollCalls(); topo.Rank != last && after != before+1 {
		t.Errorf("rank %d waited about 100 ms for rank %d and took %d roll calls, want 1", topo.Rank, last, after-before)
	}

	// Round k+1: rank 0 comes late. While the last rank waits for it, its roll call must not
	// count rank 0 in on the strength of round k's note.
	seen := make(chan []int, 1)
	if topo.Rank == last {
		go func() {
			time.Sleep(150 * time.Millisecond)
			reached, _, _ := comm.Reached()
			seen <- reached
		}()
	}
	if topo.Rank == 0 {
		time.Sleep(300 * time.Millisecond)
	}
	gather()
	if topo.Rank == last {
		if reached := <-seen; slices.Contains(reached, 0) {
			t.Errorf("rank %d counted rank 0 as arrived while it slept (reached %v): a note of an earlier round counted", last, reached)
		}
	}

	// Back-to-back rounds, as a busy job's negotiation: most complete within the spin. On a
	// machine loaded enough to delay a rank by 50 us in every round, a batch may still take the
	// roll call every time: a few batches are allowed.
	for batch := range 5 {
		rounds0, called0 := comm.RollCalls()
		for range 200 {
			gather()
		}
		rounds, called := comm.RollCalls()
		if rounds-rounds0 != 200 {
			t.Fatalf("RollCalls counted %d allgathers for 200", rounds-rounds0)
		}
		t.Logf("batch %d: %d of 200 back-to-back rounds took a roll call", batch, called-called0)
		if called-called0 < 200 {
			break
		}
		if batch == 4 {
			t.Errorf("every one of 1000 back-to-back rounds took a roll call: the fast path is never taken")
		}
	}
}

// elementCodec turns small integer values into a dtype's bytes and back, exactly: the tests
// below use values whose sums, minima, maxima and products over 3 ranks are small integers,
// exact in every type (float16 and bfloat16 included) and in any order of reduction.
type elementCodec struct {
	dt     backend.DType
	encode func(b []byte, v float64)
	decode func(b []byte) float64
}

var elementCodecs = []elementCodec{
	{backend.Float32,
		func(b []byte, v float64) { binary.LittleEndian.PutUint32(b, math.Float32bits(float32(v))) },
		func(b []byte) float64 { return float64(math.Float32frombits(binary.LittleEndian.Uint32(b))) }},
	{backend.Float64,
		func(b []byte, v float64) { binary.LittleEndian.PutUint64(b, math.Float64bits(v)) },
		func(b []byte) float64 { return math.Float64frombits(binary.LittleEndian.Uint64(b)) }},
	{backend.Int32,
		func(b []byte, v float64) { binary.LittleEndian.PutUint32(b, uint32(int32(v))) },
		func(b []byte) float64 { return float64(int32(binary.LittleEndian.Uint32(b))) }},
	{backend.Float16,
		func(b []byte, v float64) { binary.LittleEndian.PutUint16(b, fp16.FromFloat32(float32(v))) },
		func(b []byte) float64 { return float64(fp16.ToFloat32(binary.LittleEndian.Uint16(b))) }},
	{backend.BFloat16,
		func(b []byte, v float64) { binary.LittleEndian.PutUint16(b, bf16.FromFloat32(float32(v))) },
		func(b []byte) float64 { return float64(bf16.ToFloat32(binary.LittleEndian.Uint16(b))) }},
}

// reduceScatterInput is rank's element i: an integer in -4..4, 0 included.
func reduceScatterInput(rank, i int) float64 { return float64((i*7+rank*5)%9 - 4) }

// reduceScatterWant is element i of the reduction with op of the inputs of ranks (of the job),
// computed here.
func reduceScatterWant(ranks []int, i int, op backend.ReduceOp) float64 {
	acc := reduceScatterInput(ranks[0], i)
	for _, r := range ranks[1:] {
		v := reduceScatterInput(r, i)
		switch op {
		case backend.Sum:
			acc += v
		case backend.Min:
			acc = math.Min(acc, v)
		case backend.Max:
			acc = math.Max(acc, v)
		case backend.Product:
			acc *= v
		}
	}
	return acc
}

// reduceScatterCounts are the element counts per rank the reduce-scatter tests use: even
// blocks, uneven ones with empty ranks (rank 0 and every third), blocks long enough for MPI to
// reduce them otherwise than short ones, and none at all.
func reduceScatterCounts(size int) map[string][]int {
	cases := map[string][]int{}
	for _, c := range []struct {
		name  string
		count func(r int) int
	}{
		{"even", func(r int) int { return 5 }},
		{"uneven", func(r int) int { return r % 3 * (r + 2) }},
		{"long", func(r int) int { return 20000 + 3001*r }},
		{"empty", func(r int) int { return 0 }},
	} {
		counts := make([]int, size)
		for r := range counts {
			counts[r] = c.count(r)
		}
		cases[c.name] = counts
	}
	return cases
}

// ranksUpTo is every rank of a job of size ranks: the job's ranks of comm's.
func ranksUpTo(size int) []int {
	ranks := make([]int, size)
	for r := range ranks {
		ranks[r] = r
	}
	return ranks
}

// checkReduceScatter makes one reduce-scatter of elements per rank (element counts) over b, whose
// rank i is rank ranks[i] of the job, and checks this rank's block against the reduction of
// their inputs computed in Go, and that send is left as it was.
func checkReduceScatter(t *testing.T, b backend.ReduceScatterer, ranks []int, ec elementCodec, op backend.ReduceOp, elements []int) {
	t.Helper()
	topo := b.Topology()
	es := ec.dt.Size()
	counts, total, first := make([]int, len(elements)), 0, 0
	for r, n := range elements {
		counts[r] = n * es
		if r < topo.Rank {
			first += n
		}
		total += n
	}
	send := make([]byte, total*es)
	for i := range total {
		ec.encode(send[i*es:], reduceScatterInput(ranks[topo.Rank], i))
	}
	sent := slices.Clone(send)
	recv := make([]byte, counts[topo.Rank])
	if err := b.ReduceScatter(send, recv, counts, ec.dt, op); err != nil {
		t.Fatalf("%v %v, elements %v: %v", ec.dt, op, elements, err)
	}
	for j := range elements[topo.Rank] {
		got, want := ec.decode(recv[j*es:]), reduceScatterWant(ranks, first+j, op)
		if got != want {
			t.Fatalf("%v %v, elements %v: rank %d's element %d (%d of the tensor) is %v, want %v", ec.dt, op, elements, topo.Rank, j, first+j, got, want)
		}
	}
	if !bytes.Equal(send, sent) {
		t.Fatalf("%v %v, elements %v: send changed", ec.dt, op, elements)
	}
}

// TestReduceScatter: every rank receives its block of the reduction of every rank's input, for
// every op, in float32, float64, int32, float16 and bfloat16, through one MPI_Reduce_scatter
// (no MPI_Allreduce).
func TestReduceScatter(t *testing.T) {
	topo := need(t)
	cases := reduceScatterCounts(topo.Size)
	for _, ec := range elementCodecs {
		for _, op := range []backend.ReduceOp{backend.Sum, backend.Min, backend.Max, backend.Product} {
			for _, name := range []string{"even", "uneven", "long", "empty"} {
				before := comm.AllreduceCalls()
				checkReduceScatter(t, comm, ranksUpTo(topo.Size), ec, op, cases[name])
				if n := comm.AllreduceCalls() - before; n != 0 {
					t.Fatalf("%v %v, %s counts: %d MPI_Allreduce calls, want MPI_Reduce_scatter alone", ec.dt, op, name, n)
				}
			}
		}
	}
}

// TestReduceScatterPastMPICounts: a tensor of more elements than one MPI call counts (2^31-1,
// lowered here to 1000) is reduced with Allreduce, each rank keeping its block, whether every
// block fits in a call (the tensor does not: Open MPI adds the counts up in C ints) or one
// block does not.
func TestReduceScatterPastMPICounts(t *testing.T) {
	topo := need(t)
	defer func(n int) { maxCount = n }(maxCount)
	maxCount = 1000
	ec := elementCodecs[0]
	for _, elements := range [][]int{
		slices.Repeat([]int{1000/topo.Size + 1}, topo.Size),
		append(slices.Repeat([]int{3}, topo.Size-1), 1001),
	} {
		for _, op := range []backend.ReduceOp{backend.Sum, backend.Max} {
			before := comm.AllreduceCalls()
			checkReduceScatter(t, comm, ranksUpTo(topo.Size), ec, op, elements)
			if comm.AllreduceCalls() == before {
				t.Fatalf("elements %v past maxCount %d: reduced without Allreduce", elements, maxCount)
			}
		}
	}
}

// alltoallBlock is the block rank from sends rank to at scale: lengths that differ by pair and
// by direction, some empty, every rank's block to itself included; with idle, rank 1 sends to
// nobody and receives from nobody.
func alltoallBlock(from, to, scale int, idle bool) []byte {
	if idle && (from == 1 || to == 1) {
		return nil
	}
	n := ((from+2*to)%4 + 1) * scale
	if (from*2+to)%5 == 1 {
		n = 0
	}
	b := make([]byte, n)
	for k := range b {
		b[k] = byte(from*37 + to*11 + k*3)
	}
	return b
}

// TestAlltoallv: every rank receives, in rank order, the blocks every rank addressed to it, with
// empty blocks and a rank that sends and receives nothing, short and long, and with no block at
// all.
func TestAlltoallv(t *testing.T) {
	topo := need(t)
	for _, idle := range []bool{false, true} {
		for _, scale := range []int{0, 1, 3, 40000} {
			var send, want []byte
			sendCounts, recvCounts := make([]int, topo.Size), make([]int, topo.Size)
			for r := range topo.Size {
				out, in := alltoallBlock(topo.Rank, r, scale, idle), alltoallBlock(r, topo.Rank, scale, idle)
				send, sendCounts[r] = append(send, out...), len(out)
				want, recvCounts[r] = append(want, in...), len(in)
			}
			sent := slices.Clone(send)
			recv := make([]byte, len(want))
			if err := comm.Alltoallv(send, sendCounts, recv, recvCounts); err != nil {
				t.Fatalf("scale %d, rank 1 idle %v: %v", scale, idle, err)
			}
			if !bytes.Equal(recv, want) {
				t.Fatalf("scale %d, rank 1 idle %v, send counts %v, receive counts %v: received the wrong bytes", scale, idle, sendCounts, recvCounts)
			}
			if !bytes.Equal(send, sent) {
				t.Fatalf("scale %d, rank 1 idle %v: send changed", scale, idle)
			}
		}
	}
}

// TestAlltoallvPastMPICounts: a block longer than one MPI count (2^31-1, lowered here to 1000),
// or one starting past it, is an error naming the sizes, before any MPI call. Every rank's
// blocks are alike here, so every rank fails alike and none is left in MPI_Alltoallv.
func TestAlltoallvPastMPICounts(t *testing.T) {
	topo := need(t)
	defer func(n int) { maxCount = n }(maxCount)
	maxCount = 1000
	blocks := []int{1001}
	if topo.Size >= 3 {
		blocks = append(blocks, 501) // each fits; the third starts at 1002
	}
	for _, n := range blocks {
		counts := slices.Repeat([]int{n}, topo.Size)
		send, recv := make([]byte, n*topo.Size), make([]byte, n*topo.Size)
		err := comm.Alltoallv(send, counts, recv, counts)
		if err == nil || !strings.Contains(err.Error(), fmt.Sprintf("sending %d bytes", len(send))) || !strings.Contains(err.Error(), "at most 1000") {
			t.Errorf("blocks of %d bytes past maxCount 1000: %v", n, err)
		}
	}
	if err := comm.Barrier(); err != nil {
		t.Fatal(err)
	}
}

// TestReduceScatterAndAlltoallvMisuse: arguments against the contracts are errors on the rank
// that passes them, before any MPI call (every rank passes the same ones here).
func TestReduceScatterAndAlltoallvMisuse(t *testing.T) {
	topo := need(t)
	even := slices.Repeat([]int{8}, topo.Size) // bytes
	buf := make([]byte, 8*topo.Size+8)
	send, recv := buf[:8*topo.Size], buf[8*topo.Size:]
	mine := 8 * topo.Rank
	rs := func(send, recv []byte, counts []int, dt backend.DType, op backend.ReduceOp) func() error {
		return func() error { return comm.ReduceScatter(send, recv, counts, dt, op) }
	}
	a2a := func(send []byte, sendCounts []int, recv []byte, recvCounts []int) func() error {
		return func() error { return comm.Alltoallv(send, sendCounts, recv, recvCounts) }
	}
	negative := slices.Clone(even)
	negative[topo.Size-1] = -8
	short := max(0, 8*topo.Size-16) // what the negative counts add up to, where that is a length
	// A slice, not a map: should a call not fail, every rank makes the same next one.
	for _, c := range []struct {
		name string
		call func() error
	}{
		{"reduce-scatter, invalid dtype", rs(send, recv, even, backend.DType(0), backend.Sum)},
		{"reduce-scatter, invalid op", rs(send, recv, even, backend.Float32, backend.ReduceOp(0))},
		{"reduce-scatter, op past the last", rs(send, recv, even, backend.Float32, backend.Product+1)},
		{"reduce-scatter, counts for one more", rs(send, recv, append(slices.Clone(even), 8), backend.Float32, backend.Sum)},
		{"reduce-scatter, a negative count", rs(send[:short], recv, negative, backend.Float32, backend.Sum)},
		{"reduce-scatter, part of an element", rs(send[:4*topo.Size], recv[:4], slices.Repeat([]int{4}, topo.Size), backend.Float64, backend.Sum)},
		{"reduce-scatter, send too short", rs(send[:8*topo.Size-4], recv, even, backend.Float32, backend.Sum)},
		{"reduce-scatter, recv too long", rs(send, make([]byte, 12), even, backend.Float32, backend.Sum)},
		{"reduce-scatter, recv inside send", rs(send, send[mine:mine+8], even, backend.Float32, backend.Sum)},
		{"alltoallv, too few send counts", a2a(send, even[1:], make([]byte, len(send)), even)},
		{"alltoallv, too many receive counts", a2a(send, even, make([]byte, len(send)), append(slices.Clone(even), 0))},
		{"alltoallv, a negative send count", a2a(send[:short], negative, make([]byte, len(send)), even)},
		{"alltoallv, a negative receive count", a2a(send, even, make([]byte, short), negative)},
		{"alltoallv, send counts off the send", a2a(send[:8*topo.Size-1], even, make([]byte, len(send)), even)},
		{"alltoallv, receive counts off recv", a2a(send, even, make([]byte, len(send)+1), even)},
		{"alltoallv, recv overlapping send", a2a(buf[:8*topo.Size], even, buf[4:8*topo.Size+4], even)},
		{"alltoallv, the same buffer twice", a2a(send, even, send, even)},
	} {
		err := c.call()
		if err == nil || !strings.HasPrefix(err.Error(), "mpi: ") {
			t.Errorf("%s: %v", c.name, err)
		}
		if mpiErr := (*Error)(nil); errors.As(err, &mpiErr) {
			t.Errorf("%s: %v, from MPI instead of the argument check", c.name, err)
		}
	}
	if err := comm.Barrier(); err != nil {
		t.Fatal(err)
	}
}

// TestReduceScatterOverSharedMemory: with every rank on this machine, a sum of at least the
// staging threshold (16 MiB) goes over shared memory (ReduceScatterPath "SHM", no MPI call that
// reduces), in 4 MiB parts whose ends fall inside the ranks' blocks, each rank keeping its bytes of each
// part; another op, or a shorter sum, stays with MPI_Reduce_scatter.
func TestReduceScatterOverSharedMemory(t *testing.T) {
	topo := need(t)
	if comm.shm == nil {
		t.Skip("the ranks are not all on this machine")
	}
	defer func(n int) { comm.shm.stagedMin = n }(comm.shm.stagedMin)
	comm.shm.stagedMin = StagedAllreduceMinBytes
	parts := SharedAllreducePart / 4 // float32 elements in a part
	for _, ec := range elementCodecs {
		es := ec.dt.Size()
		elements := make([]int, topo.Size)
		for r := range elements {
			// 4.5 parts (18 MiB) in all, every block a different length.
			elements[r] = (9*parts/2)*4/es/topo.Size + 7*r
		}
		for _, op := range []backend.ReduceOp{backend.Sum, backend.Max} {
			before, reduces, scatters := comm.AllreduceCalls(), comm.SharedAllreduces(), comm.ReduceScatters()
			checkReduceScatter(t, comm, ranksUpTo(topo.Size), ec, op, elements)
			if n := comm.ReduceScatters() - scatters; n != 1 {
				t.Errorf("%v %v: ReduceScatters counted %d calls, want 1", ec.dt, op, n)
			}
			want := map[backend.ReduceOp]string{backend.Sum: "SHM", backend.Max: ""}[op]
			if got := comm.ReduceScatterPath(); got != want {
				t.Errorf("%v %v of %d elements: path %q, want %q", ec.dt, op, elements, got, want)
			}
			if op == backend.Sum && (comm.AllreduceCalls() != before || comm.SharedAllreduces()-reduces != 5) {
				t.Errorf("%v sum: %d MPI_Allreduce calls and %d shared-memory sums, want none and one per part (5)",
					ec.dt, comm.AllreduceCalls()-before, comm.SharedAllreduces()-reduces)
			}
		}
	}
	short := slices.Repeat([]int{1 << 10}, topo.Size)
	checkReduceScatter(t, comm, ranksUpTo(topo.Size), elementCodecs[0], backend.Sum, short)
	if got := comm.ReduceScatterPath(); got != "" {
		t.Errorf("a sum of %d bytes, under the staging threshold: path %q", 4*topo.Size<<10, got)
	}
}
