package mpi

/*
#cgo CFLAGS: -O3
#include "shm_reduce.h"
*/
import "C"

import (
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"unsafe"

	"github.com/gorovod/gorovod/horovod/backend"
)

// SharedAllreduceMinBytes is the least length of an allreduce that goes over shared memory
// when its buffer is: a shorter one stays with MPI, which needs no agreement first.
const SharedAllreduceMinBytes = 64 << 10

// StagedAllreduceMinBytes is the least length of an allreduce whose buffer is not lent memory
// (Go memory: staged, copied into a segment and back) that goes over shared memory; a shorter
// one is MPI's, on every rank alike (a rank that does not stage says so in its descriptor).
// With written inputs on the 2-core AMD EPYC of family 25, 2 ranks, a 1 MiB Sum into a reused
// Output took 174-211 us through MPI against 332-348 us staged, 4 MiB 0.79-0.99 ms against
// 1.25-1.46 ms (three alternations), while at 16 MiB staging won (4.0 ms against MPI's 6.5-8.3):
// the copy in and out costs more than MPI's single copy between the processes below it.
const StagedAllreduceMinBytes = 16 << 20

// sharedDir is where the segments are: POSIX shared memory on Linux (tmpfs).
const sharedDir = "/dev/shm"

// segmentHeader is the bytes of a segment before its data (a page, so that the data is page-aligned):
// the first four hold its state, which the ranks that map it read.
const segmentHeader = 4096

// A segment's states: live until its owner frees it, then freed, which tells the ranks that
// still map it to unmap it.
const (
	segmentLive  uint32 = 1
	segmentFreed uint32 = 2
)

// segment is one AllocHost allocation: a file in sharedDir mapped by its owner and, once an
// allreduce has needed it, by every other rank of the job.
type segment struct {
	id     uint64
	path   string
	mem    []byte // the whole mapping, header included
	data   []byte // what AllocHost returned: mem after the header
	linked bool   // its file still has its name (owner's segments; guarded by sharedMemory.mu)
}

func (s *segment) state() *uint32 { return (*uint32)(unsafe.Pointer(&s.mem[0])) }

// sharedMemory is the Comm's host memory when every rank of the job runs on this machine
// (backend.HostAllocator): buffers the other ranks map too, so that an allreduce is each rank
// summing its share of the elements straight out of every rank's buffer and writing the sum
// into all of them, between two synchronizations, instead of MPI moving every byte through its
// own shared-memory channel (MiniLM's 44 MB of gradients on the 2-core Xeon: 2.7 ms against
// 17.5 ms for one in-place MPI_Allreduce). A buffer that is not such memory is staged: copied
// into a segment kept for that, summed there and copied back, which beats MPI from
// StagedAllreduceMinBytes up (make bench-peer).
//
// A segment's file is named after its owner's process, the job (a nonce rank 0 drew at Open),
// the rank and a counter, and lives only until every rank has mapped it, at the end of the first
// allreduce that needs it, or until it is freed: a job that dies leaves at most the files of
// buffers no allreduce has used yet, which the next job on the machine removes at Open
// (removeDeadSegments). The owner marks a freed segment in its header; another rank unmaps it when it next
// maps a segment of that owner.
type sharedMemory struct {
	paths      []string // by rank: the path of its segments but the counter
	rank, size int
	mu         sync.Mutex // guards own, nextID and the segments' linked: AllocHost and FreeHost may run during a collective
	own        []*segment
	nextID     uint64
	closed     bool                  // after Comm.Close, which freed everything: FreeHost does nothing
	peers      []map[uint64]*segment // other ranks' segments mapped here, by rank and id: the collectives' goroutine only
	staging    *segment              // where an allreduce of memory not lent is summed (collectives' goroutine)
	noStaging  bool                  // tests: no staging, as if it could not be allocated
	stagedMin  int                   // StagedAllreduceMinBytes; tests lower it to stage short buffers
	beforePart func(off int)         // tests: called before each part of sharedAllreduce
	reduces    atomic.Uint64         // allreduces (parts of at most SharedAllreducePart) done over shared memory
	broadcasts atomic.Uint64         // broadcasts done over shared memory
	gathers    atomic.Uint64         // allgathers done over shared memory
}

func newSharedMemory(nonce uint64, rank, size int, pids []byte) *sharedMemory {
	m := &sharedMemory{rank: rank, size: size, paths: make([]string, size), peers: make([]map[uint64]*segment, size), stagedMin: StagedAllreduceMinBytes}
	for p := range m.peers {
		m.peers[p] = map[uint64]*segment{}
		m.paths[p] = fmt.Sprintf("%s/%s%d-%016x-%d-", sharedDir, segmentPrefix, binary.LittleEndian.Uint64(pids[8*p:]), nonce, p)
	}
	return m
}

// segmentPrefix begins every segment's file name, which goes on with the owner's process ID,
// the job's nonce, the owner's rank and the segment's counter.
const segmentPrefix = "gorovod-"

func (m *sharedMemory) path(rank int, id uint64) string {
	return fmt.Sprintf("%s%d", m.paths[rank], id)
}

// removeDeadSegments removes the files in dir of segments whose owner process no longer runs: a
// job that died before its first allreduce (or before FreeHost) left them. A process ID reused
// since by another process keeps its dead namesake's files until that one ends too.
//
// The owner's ID alone would not do: a job in another PID namespace that shares dir (containers
// run with --ipc=host, Kubernetes' hostIPC) has IDs this one cannot see, which look dead, and
// removing a live job's segment made its next FreeHost fail and abort it. The owner holds a
// shared flock on each of its segments while it maps it (allocSegment), which the kernel drops
// when the process ends: a file is removed only when its owner's ID looks dead and no one holds
// that lock.
func removeDeadSegments(dir string) {
	entries, err := os.ReadDir(dir)
	if err != nil {
		return
	}
	for _, e := range entries {
		rest, ok := strings.CutPrefix(e.Name(), segmentPrefix)
		if !ok {
			continue
		}
		pidText, _, ok := strings.Cut(rest, "-")
		pid, err := strconv.Atoi(pidText)
		if !ok || err != nil || pid <= 0 {
			continue
		}
		if syscall.Kill(pid, 0) == syscall.ESRCH && unlocked(filepath.Join(dir, e.Name())) {
			os.Remove(filepath.Join(dir, e.Name())) // another job's sweep may have been first
		}
	}
}

// unlocked reports whether no process holds a lock on the file at path (false when it cannot be
// opened: it may be gone, or not be ours to judge).
func unlocked(path string) bool {
	fd, err := syscall.Open(path, syscall.O_RDONLY|syscall.O_CLOEXEC, 0)
	if err != nil {
		return false
	}
	defer syscall.Close(fd)
	return syscall.Flock(fd, syscall.LOCK_EX|syscall.LOCK_NB) == nil
}

// alloc returns n bytes of a new segment, its pages reserved (fallocate, so that a full
// sharedDir is an error here, not a SIGBUS at the first write).
func (m *sharedMemory) alloc(n int) ([]byte, error) {
	s, err := m.allocSegment(n)
	if err != nil {
		return nil, err
	}
	return s.data, nil
}

func (m *sharedMemory) allocSegment(n int) (*segment, error) {
	m.mu.Lock()
	id := m.nextID
	m.nextID++
	m.mu.Unlock()
	path := m.path(m.rank, id)
	fd, err := syscall.Open(path, syscall.O_RDWR|syscall.O_CREAT|syscall.O_EXCL|syscall.O_CLOEXEC, 0o600)
	if err != nil {
		return nil, fmt.Errorf("mpi: shared memory: %w", &os.PathError{Op: "create", Path: path, Err: err})
	}
	defer syscall.Close(fd)
	// Held until the segment is unmapped here (the mapping keeps the open file, and its lock,
	// after the descriptor is closed) or the process ends: removeDeadSegments's sign of life.
	if err := syscall.Flock(fd, syscall.LOCK_SH); err != nil {
		syscall.Unlink(path)
		return nil, fmt.Errorf("mpi: shared memory: %w", &os.PathError{Op: "flock", Path: path, Err: err})
	}
	size := segmentHeader + n
	if err := syscall.Fallocate(fd, 0, 0, int64(size)); err != nil {
		syscall.Unlink(path)
		return nil, fmt.Errorf("mpi: shared memory: reserving %d bytes: %w", size, &os.PathError{Op: "fallocate", Path: path, Err: err})
	}
	mem, err := syscall.Mmap(fd, 0, size, syscall.PROT_READ|syscall.PROT_WRITE, syscall.MAP_SHARED)
	if err != nil {
		syscall.Unlink(path)
		return nil, fmt.Errorf("mpi: shared memory: %w", &os.PathError{Op: "mmap", Path: path, Err: err})
	}
	s := &segment{id: id, path: path, mem: mem, data: mem[segmentHeader:], linked: true}
	atomic.StoreUint32(s.state(), segmentLive)
	m.mu.Lock()
	m.own = append(m.own, s)
	m.mu.Unlock()
	return s, nil
}

// free gives back a segment alloc returned, whole.
func (m *sharedMemory) free(buf []byte) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.closed {
		return nil
	}
	for i, s := range m.own {
		if len(buf) == len(s.data) && len(buf) > 0 && &buf[0] == &s.data[0] {
			m.own = append(m.own[:i], m.own[i+1:]...)
			return m.release(s)
		}
	}
	return fmt.Errorf("mpi: FreeHost of %d bytes that are not an allocation of AllocHost (a part of one, or freed already)", len(buf))
}

// release marks s freed for the ranks that map it, unmaps it and removes its name if it still
// has one. m.mu is held.
func (m *sharedMemory) release(s *segment) error {
	atomic.StoreUint32(s.state(), segmentFreed)
	var errs []error
	if s.linked {
		s.linked = false
		if err := unlinkSegment(s.path); err != nil {
			errs = append(errs, err)
		}
	}
	if err := syscall.Munmap(s.mem); err != nil {
		errs = append(errs, &os.PathError{Op: "munmap", Path: s.path, Err: err})
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("mpi: shared memory: %w", err)
	}
	return nil
}

// find is the segment of this rank in which buf lies whole, and buf's offset in its data.
func (m *sharedMemory) find(buf []byte) (s *segment, off int, linked bool) {
	if len(buf) == 0 {
		return nil, 0, false
	}
	p := uintptr(unsafe.Pointer(&buf[0]))
	m.mu.Lock()
	defer m.mu.Unlock()
	for _, s := range m.own {
		base := uintptr(unsafe.Pointer(&s.data[0]))
		if p >= base && p+uintptr(len(buf)) <= base+uintptr(len(s.data)) {
			return s, int(p - base), s.linked
		}
	}
	return nil, 0, false
}

// unlink removes the name of s once every rank maps it.
func (m *sharedMemory) unlink(s *segment) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if !s.linked {
		return nil
	}
	s.linked = false
	if err := unlinkSegment(s.path); err != nil {
		return fmt.Errorf("mpi: shared memory: %w", err)
	}
	return nil
}

// unlinkSegment removes a segment's name. A name already gone (someone cleaned dir by hand) is
// no failure: the memory is this process's mapping, which the name never kept.
func unlinkSegment(path string) error {
	if err := syscall.Unlink(path); err != nil && err != syscall.ENOENT {
		return &os.PathError{Op: "unlink", Path: path, Err: err}
	}
	return nil
}

// peer maps segment id of rank, or returns it mapped already; mapping one, it first unmaps
// the segments of that rank that their owner has freed since.
func (m *sharedMemory) peer(rank int, id uint64) (*segment, error) {
	if s := m.peers[rank][id]; s != nil {
		return s, nil
	}
	for oid, s := range m.peers[rank] {
		if atomic.LoadUint32(s.state()) == segmentFreed {
			syscall.Munmap(s.mem) // nothing to do about a failure but leave the mapping
			delete(m.peers[rank], oid)
		}
	}
	path := m.path(rank, id)
	fd, err := syscall.Open(path, syscall.O_RDWR|syscall.O_CLOEXEC, 0)
	if err != nil {
		return nil, &os.PathError{Op: "open", Path: path, Err: err}
	}
	defer syscall.Close(fd)
	var st syscall.Stat_t
	if err := syscall.Fstat(fd, &st); err != nil {
		return nil, &os.PathError{Op: "stat", Path: path, Err: err}
	}
	if st.Size < segmentHeader {
		return nil, fmt.Errorf("%s: %d bytes, shorter than a segment's header", path, st.Size)
	}
	mem, err := syscall.Mmap(fd, 0, int(st.Size), syscall.PROT_READ|syscall.PROT_WRITE, syscall.MAP_SHARED)
	if err != nil {
		return nil, &os.PathError{Op: "mmap", Path: path, Err: err}
	}
	s := &segment{id: id, path: path, mem: mem, data: mem[segmentHeader:]}
	m.peers[rank][id] = s
	return s, nil
}

// close frees this rank's segments and unmaps the other ranks'.
func (m *sharedMemory) close() error {
	m.mu.Lock()
	defer m.mu.Unlock()
	var errs []error
	for _, s := range m.own {
		errs = append(errs, m.release(s))
	}
	m.own, m.closed = nil, true
	for _, segs := range m.peers {
		for id, s := range segs {
			syscall.Munmap(s.mem)
			delete(segs, id)
		}
	}
	return errors.Join(errs...)
}

// descriptor is what every rank tells the others before a shared-memory collective: whether
// it takes part, whether its buffer lies in one of its segments, which, where, whether that
// segment's file still has its name (some rank may not have mapped it yet), and, for a
// broadcast's root, whether the buffer is staged (the root's data comes through its staging
// segment a part at a time) rather than lent (read where it lies).
type descriptor struct {
	ok, linked, staged bool
	id, off            uint64
}

const descriptorBytes = 24

func (d descriptor) encode(b []byte) {
	var flags uint64
	if d.ok {
		flags |= 1
	}
	if d.linked {
		flags |= 2
	}
	if d.staged {
		flags |= 4
	}
	binary.LittleEndian.PutUint64(b[0:], flags)
	binary.LittleEndian.PutUint64(b[8:], d.id)
	binary.LittleEndian.PutUint64(b[16:], d.off)
}

func decodeDescriptor(b []byte) descriptor {
	flags := binary.LittleEndian.Uint64(b[0:])
	return descriptor{ok: flags&1 != 0, linked: flags&2 != 0, staged: flags&4 != 0, id: binary.LittleEndian.Uint64(b[8:]), off: binary.LittleEndian.Uint64(b[16:])}
}

// segmentDescriptor describes n bytes at off in seg, which is this rank's (nil: this rank
// cannot take part).
func (m *sharedMemory) segmentDescriptor(seg *segment, off int) descriptor {
	if seg == nil {
		return descriptor{}
	}
	return descriptor{ok: true, linked: m.isLinked(seg), id: seg.id, off: uint64(off)}
}

// mapShared tells every rank mine (this rank's descriptor; own the segment it names, if any)
// and maps, of every other rank p, the span(p, its descriptor) bytes at its descriptor's offset
// (none where span is 0). The allgather is also a synchronization: every rank's data is in place
// when it returns. ok is false, alike on every rank, when some rank cannot take part or, the
// first time a segment is used, some rank could not map a segment (an agreement, after which
// the owners remove the files' names): the collective is then left to MPI.
func (c *Comm) mapShared(mine descriptor, own *segment, span func(p int, d descriptor) int) (peers [][]byte, descs []descriptor, ok bool, err error) {
	m := c.shm
	b := make([]byte, descriptorBytes)
	mine.encode(b)
	all, err := c.allgatherEqual(b)
	if err != nil {
		return nil, nil, false, err
	}
	descs = make([]descriptor, m.size)
	for p := range descs {
		if descs[p] = decodeDescriptor(all[descriptorBytes*p:]); !descs[p].ok {
			return nil, nil, false, nil
		}
	}
	peers = make([][]byte, m.size)
	anyLinked := false
	var mapErr error
	for p, d := range descs {
		anyLinked = anyLinked || d.linked
		n := span(p, d)
		if p == m.rank || n == 0 {
			continue
		}
		s, err := m.peer(p, d.id)
		if err == nil && d.off+uint64(n) > uint64(len(s.data)) {
			err = fmt.Errorf("%s: %d bytes at offset %d run past its %d", s.path, n, d.off, len(s.data))
		}
		if err != nil {
			mapErr = fmt.Errorf("mpi: shared memory of rank %d: %w", p, err)
			continue
		}
		peers[p] = s.data[d.off : d.off+uint64(n)]
	}
	if anyLinked {
		agreed, err := c.agree(mapErr == nil)
		if err != nil || !agreed {
			return nil, nil, false, err
		}
		if mine.linked {
			if err := m.unlink(own); err != nil {
				return nil, nil, false, err
			}
		}
	} else if mapErr != nil {
		// Every segment was mapped by every rank in an earlier collective and is not freed (it
		// is in use): not mapping one now is a bug, not a condition to recover from.
		return nil, nil, false, mapErr
	}
	return peers, descs, true, nil
}

// SharedAllreducePart is the largest part of an allreduce that goes over shared memory at once:
// a longer one goes in parts this long (each its own synchronizations), chosen on the length
// alone, so alike on every rank. A rank whose buffer is not shared memory stages a part at a
// time through a segment this long, kept from call to call, and the parts stay in the cores'
// caches between copying in, summing and copying out: on the 2-core Xeon, 2 ranks, 64 MiB
// staged in 4 MiB parts took 18-23 ms, in one 64 MiB part 30-37 ms, MPI_Allreduce 39-47 ms
// (make bench-peer's rows into a reused Output; 1 MiB and 16 MiB parts within the noise of
// 4 MiB).
const SharedAllreducePart = 4 << 20

// sharedAllreduce sums send into recv over shared memory, in parts of at most
// SharedAllreducePart bytes (chosen on the length alone, so alike on every rank); done is false
// when some rank could not take part in the first part (its staging segment could not be
// allocated, or a segment not mapped), which every rank learns alike, and MPI is left to do the
// allreduce; after the first, MPI does the remaining parts here.
func (c *Comm) sharedAllreduce(send, recv []byte, dt backend.DType) (done bool, err error) {
	step := SharedAllreducePart / 64 * 64 // whole cache lines, so whole elements of every dtype
	for off := 0; off < len(recv); off += step {
		end := min(off+step, len(recv))
		if c.shm.beforePart != nil {
			c.shm.beforePart(off)
		}
		part := recv[off:end]
		done, err := c.sharedSumPart(send[off:end], part, dt, len(recv) >= c.shm.stagedMin, func(sum []byte) { copy(part, sum) })
		if !done || err != nil {
			if off > 0 && err == nil {
				// The ranks agreed to go on with MPI after an earlier part went over shared
				// memory: MPI does the rest, and the allreduce is done (the parts already
				// summed must not be summed again).
				return true, c.mpiAllreduce(send[off:], recv[off:], dt, backend.Sum)
			}
			return done, err
		}
	}
	return true, nil
}

// sharedSumPart is one part of sharedAllreduce or sharedReduceScatter: the sum over the ranks
// of send, as long as recv. recv is summed where it lies when it is in one of this rank's
// segments (after send is copied into it); otherwise, when stage is set, send is copied into the
// staging segment and summed there, and deliver copies what it wants out of the sum; when it is
// not, the part is left to MPI. recv nil is never in a segment: a reduce-scatter stages the
// whole tensor and keeps its block.
//
// Once mapShared has told every rank where every buffer lies (and that its data is in place),
// each rank sums its share of the elements (whole cache lines) in every rank's buffer and writes
// the sum into all of them; a barrier ends it.
func (c *Comm) sharedSumPart(send, recv []byte, dt backend.DType, stage bool, deliver func(sum []byte)) (done bool, err error) {
	m := c.shm
	work := recv
	seg, off, _ := m.find(recv)
	if seg == nil && stage {
		// A rank that cannot stage says so in its descriptor, and every rank leaves this part
		// to MPI.
		if staged, stageErr := m.stage(len(send)); stageErr == nil {
			seg, work = staged, staged.data[:len(send)]
		}
	}
	if seg != nil && &send[0] != &work[0] {
		copy(work, send)
	}
	peers, _, ok, err := c.mapShared(m.segmentDescriptor(seg, off), seg, func(int, descriptor) int { return len(send) })
	if !ok || err != nil {
		return false, err
	}
	bufs := make([]unsafe.Pointer, m.size)
	for p := range bufs {
		if p == m.rank {
			bufs[p] = unsafe.Pointer(&work[0])
		} else {
			bufs[p] = unsafe.Pointer(&peers[p][0])
		}
	}
	es := dt.Size()
	n := len(send) / es
	line := 64 / es // whole cache lines per rank: no two ranks write the same line
	per := (n + m.size - 1) / m.size
	per = (per + line - 1) / line * line
	lo, hi := min(m.rank*per, n), min((m.rank+1)*per, n)
	switch dt {
	case backend.Float16, backend.BFloat16:
		sumHalves(bufs, lo, hi, dt == backend.BFloat16)
	default:
		if C.gorovod_shm_sum((*unsafe.Pointer)(unsafe.Pointer(&bufs[0])), C.int(m.size), C.size_t(lo), C.size_t(hi), C.int(dt)) != 0 {
			return false, fmt.Errorf("mpi: shared-memory sum of %v is not supported", dt)
		}
	}
	if err := c.Barrier(); err != nil {
		return false, err
	}
	if len(recv) == 0 || &work[0] != &recv[0] {
		deliver(work)
	}
	m.reduces.Add(1)
	return true, nil
}

// sharedReduceScatter is ReduceScatter's sum over shared memory: send is summed as
// sharedAllreduce sums a buffer it stages, in the same parts, and this rank copies out of each
// part's sum only the bytes of its block, which starts at byte at of the tensor (Open MPI's
// MPI_Reduce_scatter reduces the whole tensor into a buffer it allocates per call: 2 ranks,
// 64 MiB, 80 ms against 16 ms for an allreduce in shared memory keeping the block). done is
// false when some rank could not stage the first part, and MPI is left to do it all.
func (c *Comm) sharedReduceScatter(send, recv []byte, at int, dt backend.DType) (done bool, err error) {
	step := SharedAllreducePart / 64 * 64
	for off := 0; off < len(send); off += step {
		end := min(off+step, len(send))
		lo, hi := max(off, at), min(end, at+len(recv)) // this rank's bytes in the part
		keep := func(sum []byte) {
			if lo < hi {
				copy(recv[lo-at:hi-at], sum[lo-off:hi-off])
			}
		}
		done, err := c.sharedSumPart(send[off:end], nil, dt, true, keep)
		if !done || err != nil {
			if off > 0 && err == nil {
				// As in sharedAllreduce, MPI sums the rest, here whole, of which this rank
				// keeps its bytes.
				rest := make([]byte, len(send)-off)
				if err := c.mpiAllreduce(send[off:], rest, dt, backend.Sum); err != nil {
					return true, err
				}
				if lo = max(off, at); lo < at+len(recv) {
					copy(recv[lo-at:], rest[lo-off:])
				}
				return true, nil
			}
			return done, err
		}
	}
	return true, nil
}

// SharedBroadcastMinBytes is the least length of a broadcast that goes over shared memory in
// a job of 3 ranks or more, SharedBroadcastMinBytes2 in one of 2 (sharedBroadcastMin): a shorter
// one stays with MPI, which needs no allgather of descriptors first. On the 2-core AMD EPYC
// (make bench-peer's reused broadcast of Go memory, staged, alternated with MPI in one session,
// load 3-7 from other jobs), 3 ranks: 1 MiB took 0.22-0.30 ms over shared memory against
// 0.30-0.46 ms with MPI (512 KiB as long either way), 4 MiB 0.63-1.35 against 1.04-1.30 ms. At 2
// ranks MPI_Bcast is one copy that the receiver makes out of the root's memory without the root
// running, the staged broadcast two, handed over part by part, which a loaded machine delays: 1
// to 4 MiB was as fast or slower (1 MiB 0.20-0.30 against 0.11-0.24 ms), 16 MiB faster in 4 of
// 6 alternations (1.6-2.7 against 2.3-3.9 ms) and 4.5x slower in 2 (17 ms, load 6-7); 64 MiB
// faster in 5 of 6 (4.7-13.5 against 14.7-22.6 ms), 256 MiB in 6 of 6.
const (
	SharedBroadcastMinBytes  = 1 << 20
	SharedBroadcastMinBytes2 = 64 << 20
)

// sharedBroadcastMin is the least length of a broadcast that goes over shared memory in a job
// of size ranks.
func sharedBroadcastMin(size int) int {
	return bySize(size, SharedBroadcastMinBytes2, SharedBroadcastMinBytes)
}

// bySize is two in a job of 2 ranks, more in a larger one: a threshold chosen on the job's
// layout alone, so alike on every rank. At 2 ranks MPI moves the data in one copy out of the
// other rank's memory, where the staged collectives over shared memory make two.
func bySize(size, two, more int) int {
	if size == 2 {
		return two
	}
	return more
}

// SharedCopyPart is the part of a broadcast's or allgather's data that a rank whose buffer is
// not shared memory copies into its staging segment at a time (sharedCopy): the segment holds
// two parts, so that the rank copies part k+1 while the others copy part k out, a barrier after
// each part (two parts are SharedAllreducePart, the staging segment an allreduce keeps anyway).
// On the 2-core AMD EPYC, a 64 MiB broadcast took 5.9-9.2 ms in 2 and 4 MiB parts at 2 ranks
// (11-12 ms at 3), 7-65 ms in 1 MiB parts and 12-160 ms in 256 and 512 KiB parts, whose barriers
// cost more than the overlap gains.
const SharedCopyPart = SharedAllreducePart / 2

// SharedAllgatherMinBytes is the least length of an allgather's result that goes over shared
// memory in a job of 3 ranks or more, SharedAllgatherMinBytes2 in one of 2 (sharedAllgather). On
// the 2-core AMD EPYC with AVX2 (make bench-peer's AllgatherInto of Go memory, staged, alternated
// with MPI three times, load 3-5 from other jobs), 3 ranks: 1 MiB per rank took 0.57-0.83 ms
// against 1.73-1.98 ms with MPI, 64 MiB 46-96 against 89-101 ms, and 256 KiB per rank (768 KiB
// in all) 0.20-0.31 against 0.49-0.63 ms. At 2 ranks MPI_Allgatherv is one copy out of the
// other rank's memory, the staged allgather two: on the 2-core AMD EPYC of family 26 (32 MiB of
// L3 cache; alternated with MPI three times, alone), up to 4 MiB per rank (8 MiB in all) MPI was
// as fast or faster (4 MiB: 0.34-0.43 against 0.43-0.44 ms), from 6 MiB per rank shared memory
// was faster every time (6 MiB: 0.43-0.46 against 0.51-0.62 ms; 8 MiB 0.60-0.64 against
// 1.10-1.31; 16 MiB 2.04 against 3.0-3.9; 64 MiB 6.8-9.1 against 11.4-15.7); 16 MiB in all
// leaves a margin below the sizes where it won. On the AVX2 machine, loaded, six 2-rank
// alternations could not tell the two apart at 64 MiB.
const (
	SharedAllgatherMinBytes  = 1 << 20
	SharedAllgatherMinBytes2 = 16 << 20
)

// sharedAllgatherMin is the least length of an allgather's result that goes over shared memory
// in a job of size ranks.
func sharedAllgatherMin(size int) int {
	return bySize(size, SharedAllgatherMinBytes2, SharedAllgatherMinBytes)
}

// sharedAllgather reports whether an allgather of total bytes in all goes over shared memory in
// a job of size ranks: on the job's layout and the counts, which every rank has, alone.
func sharedAllgather(size, total int) bool {
	return size >= 2 && total >= sharedAllgatherMin(size)
}

// sharedBroadcast sends root's buf to every rank over shared memory (sharedCopy); done is false
// when MPI is to do it.
func (c *Comm) sharedBroadcast(buf []byte, root int) (done bool, err error) {
	lens := make([]int, c.shm.size)
	lens[root] = len(buf)
	done, err = c.sharedCopy(buf, lens, func(p int) []byte {
		if p == root && c.shm.rank != root {
			return buf
		}
		return nil
	})
	if done {
		c.shm.broadcasts.Add(1)
	}
	return done, err
}

// sharedAllgatherv gathers every rank's send into recv over shared memory (sharedCopy), rank
// p's counts[p] bytes at the sum of the counts before it; done is false when MPI is to do it.
func (c *Comm) sharedAllgatherv(send, recv []byte, counts []int) (done bool, err error) {
	displs := make([]int, len(counts)+1)
	for p, n := range counts {
		displs[p+1] = displs[p] + n
	}
	done, err = c.sharedCopy(send, counts, func(p int) []byte { return recv[displs[p]:displs[p+1]] })
	if done {
		c.shm.gathers.Add(1)
	}
	return done, err
}

// sharedCopy copies, over shared memory, every rank p's data (lens[p] bytes; mine on this rank)
// into into(p) on every rank where into(p) is not empty; done is false when some rank with
// data could not take part (its staging segment could not be allocated) or some rank could not
// map another's segment, which every rank learns alike, and MPI is left to do it. Data that is
// in one of its rank's segments is read where it lies, in one copy, and a barrier ends it (the
// data must not change before). Other data goes through its rank's staging segment a
// SharedCopyPart at a time: the rank copies part k+1 into one half while the others copy
// part k out of the other half, a barrier after each part.
func (c *Comm) sharedCopy(mine []byte, lens []int, into func(p int) []byte) (done bool, err error) {
	m := c.shm
	desc := descriptor{ok: true}
	var seg *segment
	if lens[m.rank] > 0 {
		var off int
		if seg, off, _ = m.find(mine); seg != nil {
			desc = m.segmentDescriptor(seg, off)
		} else if staged, stageErr := m.stage(min(len(mine), 2*SharedCopyPart)); stageErr == nil {
			seg = staged
			desc = m.segmentDescriptor(seg, 0)
			desc.staged = true
			copy(seg.data, mine[:min(len(mine), SharedCopyPart)])
		} else {
			desc.ok = false // a rank that cannot stage says so, and every rank leaves it to MPI
		}
	}
	peers, descs, ok, err := c.mapShared(desc, seg, func(p int, d descriptor) int {
		switch {
		case lens[p] == 0 || len(into(p)) == 0:
			return 0
		case d.staged:
			return min(lens[p], 2*SharedCopyPart)
		}
		return lens[p]
	})
	if !ok || err != nil {
		return false, err
	}
	if own := into(m.rank); len(own) > 0 {
		copy(own, mine)
	}
	longestStaged := 0
	for p, d := range descs {
		if d.staged {
			longestStaged = max(longestStaged, lens[p])
		}
	}
	parts := max(1, (longestStaged+SharedCopyPart-1)/SharedCopyPart)
	for k := range parts {
		off, half := k*SharedCopyPart, k%2*SharedCopyPart
		if next := off + SharedCopyPart; desc.staged && next < len(mine) {
			copy(seg.data[SharedCopyPart-half:], mine[next:min(next+SharedCopyPart, len(mine))])
		}
		for p, src := range peers {
			switch dst := into(p); {
			case src == nil:
			case !descs[p].staged:
				if k == 0 {
					copy(dst, src)
				}
			case off < len(dst):
				copy(dst[off:min(off+SharedCopyPart, len(dst))], src[half:])
			}
		}
		if err := c.Barrier(); err != nil {
			return false, err
		}
	}
	return true, nil
}

// stage returns the staging segment, at least n bytes long: the one of the last call, or a new
// one when it is shorter (the old one freed, which the other ranks see and unmap).
func (m *sharedMemory) stage(n int) (*segment, error) {
	if m.noStaging {
		return nil, errors.New("staging turned off")
	}
	if m.staging != nil && len(m.staging.data) >= n {
		return m.staging, nil
	}
	if m.staging != nil {
		old := m.staging
		m.staging = nil
		if err := m.free(old.data); err != nil {
			return nil, err
		}
	}
	s, err := m.allocSegment(n)
	if err != nil {
		return nil, err
	}
	m.staging = s
	return s, nil
}

func (m *sharedMemory) isLinked(s *segment) bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	return s.linked
}

// agree reports whether ok is true on every rank.
func (c *Comm) agree(ok bool) (bool, error) {
	mine := []byte{0}
	if ok {
		mine[0] = 1
	}
	all, err := c.allgatherEqual(mine)
	if err != nil {
		return false, err
	}
	for _, b := range all {
		if b == 0 {
			return false, nil
		}
	}
	return true, nil
}

// AllocHost lends n bytes of shared memory (backend.HostAllocator) when every rank of the job
// runs on this machine: an allreduce of SharedAllreduceMinBytes or more over shared memory (see
// sharedMemory; SHM_ALLREDUCE in the timeline) sums such a buffer where it lies, where another
// buffer is copied in and out, and a broadcast over shared memory (sharedBroadcast; SHM_BCAST)
// is read out of such a root buffer where it lies, where another is staged a part at a time. On several machines, or alone, it lends nothing
// (backend.ErrNotLending).
func (c *Comm) AllocHost(n int) ([]byte, error) {
	if c.shm == nil {
		return nil, fmt.Errorf("mpi: %w: the job's ranks do not all share this machine's memory", backend.ErrNotLending)
	}
	if n <= 0 {
		return nil, fmt.Errorf("mpi: AllocHost of %d bytes", n)
	}
	return c.shm.alloc(n)
}

// FreeHost gives back memory AllocHost returned, whole.
func (c *Comm) FreeHost(buf []byte) error {
	if c.shm == nil {
		return errors.New("mpi: FreeHost: this job lends no memory")
	}
	return c.shm.free(buf)
}

// SharedAllreduces counts the allreduces this process has done over shared memory, one per
// part of at most SharedAllreducePart bytes.
func (c *Comm) SharedAllreduces() uint64 {
	if c.shm == nil {
		return 0
	}
	return c.shm.reduces.Load()
}

// SharedAllgathers counts the allgathers this process has done over shared memory.
func (c *Comm) SharedAllgathers() uint64 {
	if c.shm == nil {
		return 0
	}
	return c.shm.gathers.Load()
}

// SharedBroadcasts counts the broadcasts this process has done over shared memory.
func (c *Comm) SharedBroadcasts() uint64 {
	if c.shm == nil {
		return 0
	}
	return c.shm.broadcasts.Load()
}

// AllreducePath is "SHM" when the last Allreduce went over shared memory, "" when MPI did it
// (backend.PathReporter).
func (c *Comm) AllreducePath() string { return c.lastPath }

// BroadcastPath is "SHM" when the last Broadcast or BroadcastWhile went over shared memory, ""
// when MPI did it (backend.PathReporter).
func (c *Comm) BroadcastPath() string { return c.lastBroadcastPath }

// AllgatherPath is "SHM" when the last Allgatherv went over shared memory, "" when MPI did it
// (backend.PathReporter).
func (c *Comm) AllgatherPath() string { return c.lastGatherPath }

// ReduceScatterPath is "SHM" when the last ReduceScatter summed over shared memory.
func (c *Comm) ReduceScatterPath() string { return c.lastReduceScatterPath }
