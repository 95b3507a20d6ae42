package mpi

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"os"
	"os/exec"
	"path/filepath"
	"syscall"
	"testing"

	"github.com/gorovod/gorovod/horovod/backend"
	"github.com/gorovod/gorovod/horovod/internal/rawmpi"
)

// needShared skips unless the job runs on one machine with more than one rank, where the Comm
// lends shared memory.
func needShared(t *testing.T) backend.Topology {
	t.Helper()
	topo := need(t)
	if topo.Size < 2 || topo.LocalSize != topo.Size {
		if _, err := comm.AllocHost(1 << 20); !errors.Is(err, backend.ErrNotLending) {
			t.Errorf("AllocHost on %d ranks over several machines: %v, want ErrNotLending", topo.Size, err)
		}
		t.Skip("shared memory needs the whole job on one machine, with more than one rank")
	}
	return topo
}

// sharedValues are n values of dt for rank: small integers, exact in any order of summation.
func sharedValues(dt backend.DType, rank, n int) []byte {
	vals := make([]int, n)
	for i := range vals {
		vals[i] = (i*31+rank*17)%23 - 11
	}
	return encodeInts(dt, vals)
}

// encodeInts encodes integers as dt, wrapping the 8-bit ones.
func encodeInts(dt backend.DType, vals []int) []byte {
	b := make([]byte, len(vals)*dt.Size())
	for i, v := range vals {
		switch dt {
		case backend.Uint8, backend.Int8:
			b[i] = byte(v)
		case backend.Int32:
			binary.LittleEndian.PutUint32(b[4*i:], uint32(int32(v)))
		case backend.Int64:
			binary.LittleEndian.PutUint64(b[8*i:], uint64(int64(v)))
		case backend.Float32:
			binary.LittleEndian.PutUint32(b[4*i:], math.Float32bits(float32(v)))
		case backend.Float64:
			binary.LittleEndian.PutUint64(b[8*i:], math.Float64bits(float64(v)))
		case backend.Float16:
			binary.LittleEndian.PutUint16(b[2*i:], sixteenBits[0].narrow(float32(v)))
		case backend.BFloat16:
			binary.LittleEndian.PutUint16(b[2*i:], sixteenBits[1].narrow(float32(v)))
		}
	}
	return b
}

// sharedSumOf is the sum over every rank of sharedValues, computed here: exact, so that the
// shared-memory sum (in rank order) must match it to the bit, as must MPI's (in whatever order
// its algorithm takes on 3 ranks), checked too except for uint8, which OpenMPI 4.1's vectorized
// operator sums saturating (255 where the modular sum of 253 and 247 is 244).
func sharedSumOf(t *testing.T, dt backend.DType, n int) []byte {
	t.Helper()
	size := comm.Topology().Size
	sums := make([]int, n)
	for i := range sums {
		for r := range size {
			sums[i] += (i*31+r*17)%23 - 11
		}
	}
	want := encodeInts(dt, sums)
	got := make([]byte, len(want))
	comm.shm.noStaging = true // Go memory, not staged: MPI's sum
	err := comm.Allreduce(sharedValues(dt, comm.Topology().Rank, n), got, dt, backend.Sum)
	comm.shm.noStaging = false
	if err != nil {
		t.Fatal(err)
	}
	if comm.AllreducePath() != "" {
		t.Fatalf("an allreduce of Go memory without staging went %q", comm.AllreducePath())
	}
	if dt != backend.Uint8 && !bytes.Equal(got, want) {
		t.Fatalf("%v: MPI's sum differs from the exact one", dt)
	}
	return want
}

// An allreduce goes over shared memory (counted, and named SHM for the timeline), of buffers
// in lent memory where they lie and of Go memory staged, and gives the exact sum: every dtype it
// sums, lengths that end inside a rank's share and a cache line, a buffer at an offset in its
// segment, in place and from another buffer; a buffer shorter than SharedAllreduceMinBytes
// stays with MPI, from the same memory.
func TestSharedAllreduceMatchesMPI(t *testing.T) {
	topo := needShared(t)
	for _, c := range []struct {
		dt     backend.DType
		n, off int // elements; bytes from the segment's start
		shared bool
	}{
		{backend.Float32, SharedAllreduceMinBytes/4 + 5, 0, true},
		{backend.Float32, 3 << 20, 4096 + 4, true},
		{backend.Float64, SharedAllreduceMinBytes/8 + 3, 8, true},
		{backend.Int32, SharedAllreduceMinBytes/4 + 17, 0, true},
		{backend.Int64, SharedAllreduceMinBytes / 8, 0, true},
		{backend.Uint8, SharedAllreduceMinBytes + 1, 1, true},
		{backend.Int8, SharedAllreduceMinBytes + 63, 0, true},
		{backend.Float16, SharedAllreduceMinBytes/2 + 7, 2, true},
		{backend.BFloat16, 3<<20 + 1, 0, true},
		{backend.Float32, SharedAllreduceMinBytes/4 - 1, 0, false},
	} {
		want := sharedSumOf(t, c.dt, c.n)
		mem, err := comm.AllocHost(c.off + len(want))
		if err != nil {
			t.Fatal(err)
		}
		for _, lent := range []bool{true, false} {
			buf := make([]byte, len(want))
			if lent {
				buf = mem[c.off : c.off+len(want)]
			}
			for _, inPlace := range []bool{true, false} {
				in := sharedValues(c.dt, topo.Rank, c.n)
				send := buf
				if inPlace {
					copy(buf, in)
				} else {
					send = in
				}
				before := comm.SharedAllreduces()
				if err := comm.Allreduce(send, buf, c.dt, backend.Sum); err != nil {
					t.Fatal(err)
				}
				went, parts := comm.SharedAllreduces()-before, uint64((len(want)+SharedAllreducePart-1)/SharedAllreducePart)
				if c.shared && (went != parts || comm.AllreducePath() != "SHM") || !c.shared && (went != 0 || comm.AllreducePath() != "") {
					t.Errorf("%v x %d (lent memory %v, at offset %d, in place %v): %d shared allreduces, path %q; want shared %v", c.dt, c.n, lent, c.off, inPlace, went, comm.AllreducePath(), c.shared)
				}
				if i := firstDifference(buf, want); i >= 0 {
					t.Errorf("%v x %d (lent memory %v, at offset %d, in place %v): the sum differs from the exact one from byte %d on (%d, want %d)", c.dt, c.n, lent, c.off, inPlace, i, buf[i], want[i])
				}
			}
		}
		if err := comm.FreeHost(mem); err != nil {
			t.Fatal(err)
		}
	}
}

// halfValue is rank's element i of TestSharedHalfSumRoundsAsMPI: values of every magnitude
// from 2^-8 to 2^8 and both signs, whose sums round in float16 and bfloat16 alike; every 97th
// element is 40000 on each rank, whose sum overflows float16 (infinity) but not bfloat16.
func halfValue(rank, i int) float32 {
	if i%97 == 0 {
		return 40000
	}
	h := uint32(i*2654435761) ^ uint32(rank*40503+1)*2246822519
	h ^= h >> 15
	v := float32(h&0xffff)/65536*2 - 1
	return v * float32(math.Ldexp(1, int(h>>16)%17-8))
}

// A 16-bit sum over shared memory widens each rank's value, adds in rank order and rounds to
// nearest even after each addition, as MPI's operator (half.go) does: compared to the bit with
// that sum computed here from every rank's values and, on 2 ranks (one addition, so no order to
// differ in), with MPI's own result of the same call. Values that round and sums that overflow
// float16 are the point; sharedValues' small integers cannot tell rounding orders apart.
func TestSharedHalfSumRoundsAsMPI(t *testing.T) {
	topo := needShared(t)
	n := SharedAllreduceMinBytes/2 + 1001
	for _, f := range sixteenBits {
		t.Run(f.dt.String(), func(t *testing.T) {
			mine := make([]float32, n)
			want := make([]float32, n)
			for i := range n {
				mine[i] = halfValue(topo.Rank, i)
				sum := f.widen(f.narrow(halfValue(0, i)))
				for r := 1; r < topo.Size; r++ {
					sum = f.widen(f.narrow(sum + f.widen(f.narrow(halfValue(r, i)))))
				}
				want[i] = sum
			}
			in := f.encode(mine...)
			got := make([]byte, len(in))
			if err := comm.Allreduce(in, got, f.dt, backend.Sum); err != nil {
				t.Fatal(err)
			}
			if comm.AllreducePath() != "SHM" {
				t.Fatalf("a %v sum of %d bytes went %q, not over shared memory", f.dt, len(in), comm.AllreducePath())
			}
			if i := firstDifference(got, f.encode(want...)); i >= 0 {
				t.Fatalf("element %d: %v over shared memory, want %v (rounded after each addition, in rank order)", i/2, f.decode(got)[i/2], want[i/2])
			}
			if topo.Size != 2 {
				return
			}
			viaMPI := make([]byte, len(in))
			comm.shm.noStaging = true // Go memory, not staged: MPI's sum
			err := comm.Allreduce(in, viaMPI, f.dt, backend.Sum)
			comm.shm.noStaging = false
			if err != nil {
				t.Fatal(err)
			}
			if i := firstDifference(got, viaMPI); i >= 0 {
				t.Fatalf("element %d: %v over shared memory, %v through MPI", i/2, f.decode(got)[i/2], f.decode(viaMPI)[i/2])
			}
		})
	}
}

// An allreduce longer than SharedAllreducePart goes in parts, each over shared memory: staged, its
// staging segment no longer than SharedAllreducePart.
func TestLongAllreduceGoesInParts(t *testing.T) {
	topo := needShared(t)
	n := (SharedAllreducePart + SharedAllreducePart/2 + 12) / 4
	want := sharedSumOf(t, backend.Float32, n)
	buf := sharedValues(backend.Float32, topo.Rank, n)
	before := comm.SharedAllreduces()
	if err := comm.Allreduce(buf, buf, backend.Float32, backend.Sum); err != nil {
		t.Fatal(err)
	}
	if went := comm.SharedAllreduces() - before; went != 2 {
		t.Errorf("%d bytes: %d parts over shared memory, want 2", 4*n, went)
	}
	if !bytes.Equal(buf, want) {
		t.Error("the sum differs from the exact one")
	}
	if got := len(comm.shm.staging.data); got > SharedAllreducePart {
		t.Errorf("staging segment of %d bytes, want at most %d", got, SharedAllreducePart)
	}
}

// Where one rank cannot take part (its staging segment could not be allocated), every rank
// leaves the allreduce to MPI, alike: no rank waits in a shared-memory step the others skip.
func TestSharedAllreduceFallsBackTogether(t *testing.T) {
	topo := needShared(t)
	const n = 1 << 18
	want := sharedSumOf(t, backend.Float32, n)
	buf := sharedValues(backend.Float32, topo.Rank, n)
	comm.shm.noStaging = topo.Rank == topo.Size-1
	defer func() { comm.shm.noStaging = false }()
	before := comm.SharedAllreduces()
	if err := comm.Allreduce(buf, buf, backend.Float32, backend.Sum); err != nil {
		t.Fatal(err)
	}
	if went := comm.SharedAllreduces() - before; went != 0 || comm.AllreducePath() != "" {
		t.Errorf("one rank unable to stage: %d shared allreduces, path %q; want MPI's", went, comm.AllreducePath())
	}
	if !bytes.Equal(buf, want) {
		t.Error("the sum differs from the exact one")
	}
}

// peerSegment tells every rank the id of a segment of its own and returns peer's.
func peerSegment(t *testing.T, id uint64, peer int) uint64 {
	t.Helper()
	all, err := comm.allgatherEqual(binary.LittleEndian.AppendUint64(nil, id))
	if err != nil {
		t.Fatal(err)
	}
	return binary.LittleEndian.Uint64(all[8*peer:])
}

// When the ranks can no longer go on over shared memory after a first part (here: the last
// rank's staging fails from the second part on), MPI sums the rest, and only the rest: the
// parts already summed are not summed again.
func TestAllreduceFallsBackAfterAPart(t *testing.T) {
	topo := needShared(t)
	n := (2*SharedAllreducePart + 8) / 4
	want := sharedSumOf(t, backend.Float32, n)
	buf := sharedValues(backend.Float32, topo.Rank, n)
	comm.shm.beforePart = func(off int) { comm.shm.noStaging = off > 0 && topo.Rank == topo.Size-1 }
	defer func() { comm.shm.beforePart, comm.shm.noStaging = nil, false }()
	before := comm.SharedAllreduces()
	if err := comm.Allreduce(buf, buf, backend.Float32, backend.Sum); err != nil {
		t.Fatal(err)
	}
	if went := comm.SharedAllreduces() - before; went != 1 {
		t.Errorf("%d parts over shared memory, want 1 (then MPI)", went)
	}
	if !bytes.Equal(buf, want) {
		t.Error("the sum differs from the exact one")
	}
}

// A segment's file lives until every rank has mapped it (the end of its first allreduce), so
// that a job that dies leaves none behind for buffers already in use; one never reduced keeps
// its name until FreeHost. A rank unmaps another's segment once that one is freed.
func TestSegmentFilesAndMappingsGoAway(t *testing.T) {
	topo := needShared(t)
	const n = 1 << 16
	used, err := comm.AllocHost(4 * n)
	if err != nil {
		t.Fatal(err)
	}
	idle, err := comm.AllocHost(4096)
	if err != nil {
		t.Fatal(err)
	}
	m := comm.shm
	usedSeg, _, _ := m.find(used)
	idleSeg, _, _ := m.find(idle)
	for _, s := range []*segment{usedSeg, idleSeg} {
		if _, err := os.Stat(s.path); err != nil {
			t.Fatalf("a new segment's file: %v", err)
		}
	}
	peer := (topo.Rank + 1) % topo.Size
	if err := comm.Allreduce(used, used, backend.Float32, backend.Sum); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(usedSeg.path); !os.IsNotExist(err) {
		t.Errorf("%s after an allreduce every rank mapped it for: %v, want it removed", usedSeg.path, err)
	}
	if _, err := os.Stat(idleSeg.path); err != nil {
		t.Errorf("%s, never reduced: %v, want it there", idleSeg.path, err)
	}
	peerUsed := peerSegment(t, usedSeg.id, peer)
	if m.peers[peer][peerUsed] == nil {
		t.Errorf("rank %d's segment %d, reduced, is not mapped here", peer, peerUsed)
	}
	if err := comm.FreeHost(idle); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(idleSeg.path); !os.IsNotExist(err) {
		t.Errorf("%s after FreeHost: %v, want it removed", idleSeg.path, err)
	}
	if err := comm.FreeHost(used); err != nil {
		t.Fatal(err)
	}
	if err := comm.Barrier(); err != nil { // every rank has freed its segment
		t.Fatal(err)
	}
	next, err := comm.AllocHost(4 * n)
	if err != nil {
		t.Fatal(err)
	}
	if err := comm.Allreduce(next, next, backend.Float32, backend.Sum); err != nil {
		t.Fatal(err)
	}
	nextSeg, _, _ := m.find(next)
	if id := peerSegment(t, nextSeg.id, peer); m.peers[peer][id] == nil {
		t.Errorf("rank %d's segment %d, reduced, is not mapped here", peer, id)
	}
	if m.peers[peer][peerUsed] != nil {
		t.Errorf("rank %d's segment %d is still mapped here after it was freed", peer, peerUsed)
	}
	if err := comm.Barrier(); err != nil { // every rank has looked before any frees next
		t.Fatal(err)
	}
	if err := comm.FreeHost(next); err != nil {
		t.Fatal(err)
	}
	if err := comm.FreeHost(next); err == nil {
		t.Error("a second FreeHost of the same memory: no error")
	}
	part, err := comm.AllocHost(8192)
	if err != nil {
		t.Fatal(err)
	}
	if err := comm.FreeHost(part[:4096]); err == nil {
		t.Error("FreeHost of part of an allocation: no error")
	}
	if err := comm.FreeHost(part); err != nil {
		t.Error(err)
	}
}

// The files of segments whose owner process has ended are removed at the next Open on the
// machine; a running owner's, and files of other names, are left alone.
func TestDeadSegmentsAreRemoved(t *testing.T) {
	dir := t.TempDir()
	ended := exec.Command("true")
	if err := ended.Run(); err != nil {
		t.Fatal(err)
	}
	dead := fmt.Sprintf("%s%d-0123456789abcdef-1-0", segmentPrefix, ended.ProcessState.Pid())
	keep := []string{
		fmt.Sprintf("%s%d-0123456789abcdef-0-3", segmentPrefix, os.Getpid()),
		segmentPrefix + "notapid-1-2",
		"another-program",
	}
	for _, name := range append([]string{dead}, keep...) {
		if err := os.WriteFile(filepath.Join(dir, name), nil, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	// An owner this process cannot see (another PID namespace sharing the directory) holds its
	// segment's lock: its ID looks dead, but the file stays until the lock goes.
	unseen := fmt.Sprintf("%s%d-fedcba9876543210-0-0", segmentPrefix, ended.ProcessState.Pid())
	if err := os.WriteFile(filepath.Join(dir, unseen), nil, 0o600); err != nil {
		t.Fatal(err)
	}
	owner, err := os.Open(filepath.Join(dir, unseen))
	if err != nil {
		t.Fatal(err)
	}
	defer owner.Close()
	if err := syscall.Flock(int(owner.Fd()), syscall.LOCK_SH); err != nil {
		t.Fatal(err)
	}
	removeDeadSegments(dir)
	if _, err := os.Stat(filepath.Join(dir, dead)); !os.IsNotExist(err) {
		t.Errorf("%s, whose owner has ended: %v, want it removed", dead, err)
	}
	for _, name := range append(keep, unseen) {
		if _, err := os.Stat(filepath.Join(dir, name)); err != nil {
			t.Errorf("%s: %v, want it left alone", name, err)
		}
	}
	owner.Close()
	removeDeadSegments(dir)
	if _, err := os.Stat(filepath.Join(dir, unseen)); !os.IsNotExist(err) {
		t.Errorf("%s once its lock is gone: %v, want it removed", unseen, err)
	}
}

// A segment's owner holds a lock on its file while it maps it, after the descriptor is closed,
// and a name removed by someone else does not fail the segment's FreeHost.
func TestSegmentsAreLockedWhileMapped(t *testing.T) {
	m := newSharedMemory(0x5eed, 0, 1, binary.LittleEndian.AppendUint64(nil, uint64(os.Getpid())))
	buf, err := m.alloc(4096)
	if err != nil {
		t.Skipf("no shared memory here: %v", err)
	}
	path := m.path(0, 0)
	if unlocked(path) {
		t.Errorf("%s unlocked while its owner maps it", path)
	}
	if err := os.Remove(path); err != nil {
		t.Fatal(err)
	}
	if err := m.free(buf); err != nil {
		t.Errorf("FreeHost of a segment whose name was removed: %v", err)
	}
}

// broadcastValues are n bytes a broadcast from root sends: different for every root and length,
// and with no period a part's length divides (a part copied from the wrong place shows).
func broadcastValues(root, n int) []byte {
	b := make([]byte, n)
	for i := range b {
		b[i] = byte((uint32(i)*2654435761 + uint32(root*977+n)) >> 24)
	}
	return b
}

// rawBroadcast is what MPI_Bcast of root's broadcastValues gives, for comparison.
func rawBroadcast(t *testing.T, root, n int) []byte {
	t.Helper()
	buf := make([]byte, n)
	if comm.Topology().Rank == root {
		copy(buf, broadcastValues(root, n))
	}
	doRaw(t, func() error { return rawmpi.Broadcast(buf, root) })
	return buf
}

// doRaw makes a raw MPI call, f, on the MPI thread and fails the test on its error.
func doRaw(t *testing.T, f func() error) {
	t.Helper()
	var err error
	comm.Do(func() { err = f() })
	if err != nil {
		t.Fatal(err)
	}
}

// firstDifference is the first index at which got and want, equally long, differ (-1: none).
func firstDifference(got, want []byte) int {
	for i := range got {
		if got[i] != want[i] {
			return i
		}
	}
	return -1
}

// A broadcast of sharedBroadcastMin(size) or more goes over shared memory (counted, and named
// SHM for the timeline), from every root, of a root's buffer in lent memory (read where it
// lies, at an offset in its segment) and of Go memory (staged through the root's staging
// segment in parts, the last one short), through Broadcast and BroadcastWhile, and every rank
// ends with the bytes MPI_Bcast gives, the root's buffer unchanged; a shorter one stays with MPI.
func TestSharedBroadcastMatchesMPI(t *testing.T) {
	topo := needShared(t)
	const off = 4096 + 8
	least := sharedBroadcastMin(topo.Size)
	for _, c := range []struct {
		n      int
		shared bool
	}{
		{least, true},
		{least + SharedCopyPart/2 + 12345, true}, // parts, the last one short
		{2 * SharedCopyPart, 2*SharedCopyPart >= least},
		{least - 1, false},
	} {
		mem, err := comm.AllocHost(off + c.n)
		if err != nil {
			t.Fatal(err)
		}
		for root := range topo.Size {
			want := rawBroadcast(t, root, c.n)
			for _, lent := range []bool{true, false} {
				for _, while := range []bool{false, true} {
					buf := make([]byte, c.n)
					if lent {
						buf = mem[off : off+c.n]
					}
					for i := range buf {
						buf[i] = 0xa5 // not what the root sends
					}
					if topo.Rank == root {
						copy(buf, broadcastValues(root, c.n))
					}
					before := comm.SharedBroadcasts()
					if while {
						calls := 0
						err = comm.BroadcastWhile(buf, root, func() { calls++ })
						if err == nil && calls != 1 {
							t.Errorf("BroadcastWhile called during %d times", calls)
						}
					} else {
						err = comm.Broadcast(buf, root)
					}
					if err != nil {
						t.Fatal(err)
					}
					what := fmt.Sprintf("%d bytes from root %d (lent memory %v, BroadcastWhile %v)", c.n, root, lent, while)
					went := comm.SharedBroadcasts() - before
					if c.shared && (went != 1 || comm.BroadcastPath() != "SHM") || !c.shared && (went != 0 || comm.BroadcastPath() != "") {
						t.Errorf("%s: %d shared broadcasts, path %q; want shared %v", what, went, comm.BroadcastPath(), c.shared)
					}
					if i := firstDifference(buf, want); i >= 0 {
						t.Errorf("%s: differs from MPI_Bcast's from byte %d on (%d, want %d)", what, i, buf[i], want[i])
					}
				}
			}
		}
		if err := comm.FreeHost(mem); err != nil {
			t.Fatal(err)
		}
	}
}

// Where the root cannot stage (its staging segment could not be allocated), every rank leaves
// the broadcast to MPI, alike; a rank that is not the root needs no staging, nor does a root whose
// buffer is lent memory: those broadcasts still go over shared memory.
func TestSharedBroadcastFallsBackTogether(t *testing.T) {
	topo := needShared(t)
	n := sharedBroadcastMin(topo.Size) + SharedCopyPart/2 + 100 // parts, the last one short
	comm.shm.noStaging = topo.Rank == topo.Size-1
	defer func() { comm.shm.noStaging = false }()
	mem, err := comm.AllocHost(n)
	if err != nil {
		t.Fatal(err)
	}
	defer comm.FreeHost(mem)
	for root := range topo.Size {
		for _, lent := range []bool{false, true} {
			want := rawBroadcast(t, root, n)
			buf := make([]byte, n)
			if lent {
				buf = mem
				clear(buf)
			}
			if topo.Rank == root {
				copy(buf, want)
			}
			before := comm.SharedBroadcasts()
			if err := comm.Broadcast(buf, root); err != nil {
				t.Fatal(err)
			}
			shared := lent || root != topo.Size-1
			if went := comm.SharedBroadcasts() - before; shared && (went != 1 || comm.BroadcastPath() != "SHM") || !shared && (went != 0 || comm.BroadcastPath() != "") {
				t.Errorf("root %d (lent memory %v), rank %d unable to stage: %d shared broadcasts, path %q; want shared %v", root, lent, topo.Size-1, went, comm.BroadcastPath(), shared)
			}
			if !bytes.Equal(buf, want) {
				t.Errorf("root %d (lent memory %v): differs from MPI_Bcast's", root, lent)
			}
		}
	}
}

// rawAllgatherv is what MPI_Allgatherv of every rank's broadcastValues(rank, counts[rank]) gives.
func rawAllgatherv(t *testing.T, counts []int) []byte {
	t.Helper()
	total := 0
	for _, n := range counts {
		total += n
	}
	recv := make([]byte, total)
	doRaw(t, func() error {
		return rawmpi.Allgatherv(broadcastValues(comm.Topology().Rank, counts[comm.Topology().Rank]), recv, counts)
	})
	return recv
}

// An allgather whose result is as long as the job's threshold (SharedAllgatherMinBytes,
// SharedAllgatherMinBytes2 at 2 ranks) or longer goes over shared memory (counted, and named SHM
// for the timeline), of data in lent memory (read where it lies, at an offset in its segment)
// and of Go memory (staged in parts, the last one short), with counts that differ and a rank
// that sends nothing, and every rank ends with the bytes MPI_Allgatherv gives; a shorter one
// stays with MPI.
func TestSharedAllgatherMatchesMPI(t *testing.T) {
	topo := needShared(t)
	const off = 4096 + 8
	least := sharedAllgatherMin(topo.Size)
	uneven, oneEmpty, short := make([]int, topo.Size), make([]int, topo.Size), make([]int, topo.Size)
	for p := range topo.Size {
		uneven[p] = max(2*SharedCopyPart, least/topo.Size) + 1000*p + 7
		oneEmpty[p] = (least + topo.Size - 2) / (topo.Size - 1) // the others' reach the threshold
		short[p] = (least - 1) / topo.Size
	}
	oneEmpty[1] = 0
	for _, c := range []struct {
		counts []int
		shared bool
	}{{uneven, true}, {oneEmpty, true}, {short, false}} {
		mine := c.counts[topo.Rank]
		mem, err := comm.AllocHost(off + mine + 1)
		if err != nil {
			t.Fatal(err)
		}
		want := rawAllgatherv(t, c.counts)
		for _, lent := range []bool{true, false} {
			send := broadcastValues(topo.Rank, mine)
			if lent {
				send = mem[off : off+mine]
				copy(send, broadcastValues(topo.Rank, mine))
			}
			recv := make([]byte, len(want))
			before := comm.SharedAllgathers()
			if err := comm.Allgatherv(send, recv, c.counts); err != nil {
				t.Fatal(err)
			}
			what := fmt.Sprintf("counts %v (lent memory %v)", c.counts, lent)
			went := comm.SharedAllgathers() - before
			if c.shared && (went != 1 || comm.AllgatherPath() != "SHM") || !c.shared && (went != 0 || comm.AllgatherPath() != "") {
				t.Errorf("%s: %d shared allgathers, path %q; want shared %v", what, went, comm.AllgatherPath(), c.shared)
			}
			if i := firstDifference(recv, want); i >= 0 {
				t.Errorf("%s: differs from MPI_Allgatherv's from byte %d on (%d, want %d)", what, i, recv[i], want[i])
			}
			if !bytes.Equal(send, broadcastValues(topo.Rank, mine)) {
				t.Errorf("%s: the send buffer changed", what)
			}
		}
		if err := comm.FreeHost(mem); err != nil {
			t.Fatal(err)
		}
	}
}

// Where a rank with data cannot stage it, every rank leaves the allgather to MPI, alike; a
// rank whose data is lent memory needs no staging: that allgather still goes over shared memory.
func TestSharedAllgatherFallsBackTogether(t *testing.T) {
	topo := needShared(t)
	counts := make([]int, topo.Size)
	for p := range counts {
		counts[p] = max(SharedCopyPart, sharedAllgatherMin(topo.Size)/topo.Size) + 100
	}
	comm.shm.noStaging = topo.Rank == topo.Size-1
	defer func() { comm.shm.noStaging = false }()
	mem, err := comm.AllocHost(counts[topo.Rank])
	if err != nil {
		t.Fatal(err)
	}
	defer comm.FreeHost(mem)
	want := rawAllgatherv(t, counts)
	for _, lent := range []bool{false, true} {
		send := broadcastValues(topo.Rank, counts[topo.Rank])
		if lent {
			send = mem
			copy(send, broadcastValues(topo.Rank, counts[topo.Rank]))
		}
		recv := make([]byte, len(want))
		before := comm.SharedAllgathers()
		if err := comm.Allgatherv(send, recv, counts); err != nil {
			t.Fatal(err)
		}
		if went := comm.SharedAllgathers() - before; lent && (went != 1 || comm.AllgatherPath() != "SHM") || !lent && (went != 0 || comm.AllgatherPath() != "") {
			t.Errorf("lent memory %v, rank %d unable to stage: %d shared allgathers, path %q; want shared %v", lent, topo.Size-1, went, comm.AllgatherPath(), lent)
		}
		if !bytes.Equal(recv, want) {
			t.Errorf("lent memory %v: differs from MPI_Allgatherv's", lent)
		}
	}
}

// Go memory is staged over shared memory from StagedAllreduceMinBytes on, and left to MPI below
// it, where MPI's one copy between the processes beats copying in and out of a segment; lent
// memory goes over shared memory from SharedAllreduceMinBytes on whatever its length. Each sum
// is exact (small integers).
func TestStagedAllreduceFromItsThreshold(t *testing.T) {
	topo := needShared(t)
	comm.shm.stagedMin = StagedAllreduceMinBytes
	defer func() { comm.shm.stagedMin = SharedAllreduceMinBytes }()
	for _, c := range []struct {
		bytes      int
		lent, want bool // lent memory; over shared memory
	}{
		{1 << 20, false, false},
		{StagedAllreduceMinBytes - 64, false, false},
		{StagedAllreduceMinBytes, false, true},
		{1 << 20, true, true},
	} {
		n := c.bytes / 4
		want := sharedSumOf(t, backend.Int32, n)
		buf := make([]byte, len(want))
		if c.lent {
			mem, err := comm.AllocHost(len(want))
			if err != nil {
				t.Fatal(err)
			}
			defer comm.FreeHost(mem)
			buf = mem
		}
		copy(buf, sharedValues(backend.Int32, topo.Rank, n))
		before := comm.SharedAllreduces()
		if err := comm.Allreduce(buf, buf, backend.Int32, backend.Sum); err != nil {
			t.Fatal(err)
		}
		if shared := comm.SharedAllreduces() > before; shared != c.want || (comm.AllreducePath() == "SHM") != c.want {
			t.Errorf("%d bytes (lent %v): over shared memory %v (path %q), want %v", c.bytes, c.lent, shared, comm.AllreducePath(), c.want)
		}
		if i := firstDifference(buf, want); i >= 0 {
			t.Errorf("%d bytes (lent %v): the sum differs from the exact one from byte %d on", c.bytes, c.lent, i)
		}
	}
}
