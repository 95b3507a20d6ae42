// Package rawmpi calls MPI_Allreduce, MPI_Bcast, MPI_Allgatherv, MPI_Reduce_scatter and
// MPI_Alltoallv on MPI_COMM_WORLD directly (and times those and MPI_Alltoall), bypassing horovod
// and its MPI backend: the independent reference that the conformance suite and horovod/mpi's
// tests check results against and the benchmark measures speed against. MPI must be initialized
// (by horovod/mpi) and every call must run on the MPI thread, through (*mpi.Comm).Do, before
// horovod's loop starts on that Comm.
package rawmpi

/*
#cgo pkg-config: ompi-c
#include <mpi.h>
#include <stdlib.h>

static MPI_Datatype raw_type(int dtype) {
	switch (dtype) {
	case 1: return MPI_UINT8_T;
	case 2: return MPI_INT8_T;
	case 3: return MPI_INT32_T;
	case 4: return MPI_INT64_T;
	case 6: return MPI_FLOAT;
	case 7: return MPI_DOUBLE;
	}
	return MPI_DATATYPE_NULL;
}

static MPI_Op raw_op(int op) {
	switch (op) {
	case 1: return MPI_SUM;
	case 2: return MPI_MIN;
	case 3: return MPI_MAX;
	case 4: return MPI_PROD;
	}
	return MPI_OP_NULL;
}

static int raw_size(void) {
	int size;
	MPI_Comm_size(MPI_COMM_WORLD, &size);
	return size;
}

static int raw_bcast(void *buf, int count, int root) {
	return MPI_Bcast(buf, count, MPI_BYTE, root, MPI_COMM_WORLD);
}

static int raw_allgatherv(const void *send, int count, void *recv, const int *counts, const int *displs) {
	return MPI_Allgatherv(send, count, MPI_BYTE, recv, counts, displs, MPI_BYTE, MPI_COMM_WORLD);
}

static int raw_reduce_scatter(const void *send, void *recv, const int *counts, int dtype, int op) {
	return MPI_Reduce_scatter(send, recv, counts, raw_type(dtype), raw_op(op), MPI_COMM_WORLD);
}

static int raw_alltoallv(const void *send, const int *send_counts, const int *send_displs, void *recv, const int *recv_counts, const int *recv_displs) {
	return MPI_Alltoallv(send, send_counts, send_displs, MPI_BYTE, recv, recv_counts, recv_displs, MPI_BYTE, MPI_COMM_WORLD);
}

static int raw_allreduce(const void *send, void *recv, int count, int dtype, int op) {
	return MPI_Allreduce(send, recv, count, raw_type(dtype), raw_op(op), MPI_COMM_WORLD);
}

// raw_subset_allreduce is MPI_Allreduce among the ranks that are members, on a communicator that
// MPI_Comm_split of MPI_COMM_WORLD makes for this call alone (a collective of every rank).
static int raw_subset_allreduce(int member, const void *send, void *recv, int count, int dtype, int op) {
	int rank, err;
	MPI_Comm sub;
	MPI_Comm_rank(MPI_COMM_WORLD, &rank);
	if ((err = MPI_Comm_split(MPI_COMM_WORLD, member ? 0 : MPI_UNDEFINED, rank, &sub)) != MPI_SUCCESS || !member) return err;
	err = MPI_Allreduce(send, recv, count, raw_type(dtype), raw_op(op), sub);
	MPI_Comm_free(&sub);
	return err;
}

// raw_time runs batches of iters calls of one collective, each batch after a barrier, and returns
// the slowest rank's best batch mean in seconds per call (the best batch filters out interference
// from other load). kind: 0 allreduce sum from send into recv (in place when they are the same
// buffer), as MPI_Allreduce calls of at most chunk elements each (all of them in one call when
// chunk is 0); 1 the same, then every float of recv multiplied by 1/size (an average, as a
// framework computes it from MPI's sum); 2 allgather of count bytes from every rank into recv; 3
// broadcast of count bytes of recv from rank 0; 4 reduce-scatter sum (MPI_Reduce_scatter) of size
// blocks of count elements from send, this rank's block into recv; 5 the same, then every float
// of recv multiplied by 1/size; 6 all-to-all (MPI_Alltoall) of count bytes to and from every rank.
static double raw_time_on(MPI_Comm comm, int kind, void *send, void *recv, int count, int dtype, int chunk, int batches, int iters) {
	int inplace = send == recv, size, esize = 1;
	MPI_Comm_size(comm, &size);
	if (kind <= 1) MPI_Type_size(raw_type(dtype), &esize);
	if (chunk <= 0 || chunk > count) chunk = count;
	// MPI_Reduce_scatter's counts, equal blocks, made before the clock starts.
	int *counts = malloc(size * sizeof(int));
	for (int r = 0; r < size; r++) counts[r] = count;
	double best = 1e300;
	for (int b = 0; b < batches; b++) {
		MPI_Barrier(comm);
		double t0 = MPI_Wtime();
		for (int i = 0; i < iters; i++) {
			switch (kind) {
			case 0:
			case 1:
				for (int off = 0; off < count; off += chunk) {
					int n = count - off < chunk ? count - off : chunk;
					char *r = (char *)recv + (size_t)off * esize;
					MPI_Allreduce(inplace ? MPI_IN_PLACE : (char *)send + (size_t)off * esize, r, n, raw_type(dtype), MPI_SUM, comm);
				}
				if (kind == 1) {
					float *v = recv, f = 1.0f / size;
					for (int j = 0; j < count; j++) v[j] *= f;
				}
				break;
			case 2:
				MPI_Allgather(send, count, MPI_BYTE, recv, count, MPI_BYTE, comm);
				break;
			case 3:
				MPI_Bcast(recv, count, MPI_BYTE, 0, comm);
				break;
			case 4:
			case 5:
				MPI_Reduce_scatter(send, recv, counts, raw_type(dtype), MPI_SUM, comm);
				if (kind == 5) {
					float *v = recv, f = 1.0f / size;
					for (int j = 0; j < count; j++) v[j] *= f;
				}
				break;
			case 6:
				MPI_Alltoall(send, count, MPI_BYTE, recv, count, MPI_BYTE, comm);
				break;
			}
		}
		double t = (MPI_Wtime() - t0) / iters;
		if (t < best) best = t;
	}
	free(counts);
	double slowest = best;
	MPI_Allreduce(&best, &slowest, 1, MPI_DOUBLE, MPI_MAX, comm);
	return slowest;
}

static double raw_time(int kind, void *send, void *recv, int count, int dtype, int chunk, int batches, int iters) {
	return raw_time_on(MPI_COMM_WORLD, kind, send, recv, count, dtype, chunk, batches, iters);
}

// raw_time_subset is raw_time among the ranks that are members, on a communicator MPI_Comm_split
// makes of MPI_COMM_WORLD for it (a collective of every rank): the slowest member's figure, on
// every rank; -1 when the split fails.
static double raw_time_subset(int member, int kind, void *send, void *recv, int count, int dtype, int batches, int iters) {
	int rank;
	MPI_Comm sub;
	double t = 0, slowest = 0;
	MPI_Comm_rank(MPI_COMM_WORLD, &rank);
	if (MPI_Comm_split(MPI_COMM_WORLD, member ? 0 : MPI_UNDEFINED, rank, &sub) != MPI_SUCCESS) return -1;
	if (member) {
		t = raw_time_on(sub, kind, send, recv, count, dtype, 0, batches, iters);
		MPI_Comm_free(&sub);
	}
	MPI_Allreduce(&t, &slowest, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
	return slowest;
}
*/
import "C"

import (
	"errors"
	"fmt"
	"unsafe"

	"github.com/gorovod/gorovod/horovod/backend"
)

func supported(dt backend.DType) error {
	if dt == backend.Float16 || dt == backend.BFloat16 || !dt.Valid() {
		return fmt.Errorf("rawmpi: MPI has no built-in type for %v", dt)
	}
	return nil
}

// Allreduce is MPI_Allreduce(send, recv) on MPI_COMM_WORLD. MPI has no float16 or bfloat16.
func Allreduce(send, recv []byte, dt backend.DType, op backend.ReduceOp) error {
	if err := supported(dt); err != nil {
		return err
	}
	if rc := C.raw_allreduce(unsafe.Pointer(&send[0]), unsafe.Pointer(&recv[0]), C.int(len(send)/dt.Size()), C.int(dt), C.int(op)); rc != 0 {
		return fmt.Errorf("rawmpi: MPI_Allreduce returned %d", int(rc))
	}
	return nil
}

// SubsetAllreduce is MPI_Allreduce(send, recv) among the ranks of MPI_COMM_WORLD that call it
// as members, on a communicator split off for the call: the reference for a process set's
// allreduce. Every rank calls it; recv is written on members only.
func SubsetAllreduce(member bool, send, recv []byte, dt backend.DType, op backend.ReduceOp) error {
	if err := supported(dt); err != nil {
		return err
	}
	in, out := unsafe.Pointer(nil), unsafe.Pointer(nil)
	if member {
		in, out = unsafe.Pointer(&send[0]), unsafe.Pointer(&recv[0])
	}
	m := C.int(0)
	if member {
		m = 1
	}
	if rc := C.raw_subset_allreduce(m, in, out, C.int(len(send)/dt.Size()), C.int(dt), C.int(op)); rc != 0 {
		return fmt.Errorf("rawmpi: MPI_Comm_split or MPI_Allreduce returned %d", int(rc))
	}
	return nil
}

// Broadcast is MPI_Bcast of buf's bytes from root on MPI_COMM_WORLD.
func Broadcast(buf []byte, root int) error {
	if rc := C.raw_bcast(unsafe.Pointer(&buf[0]), C.int(len(buf)), C.int(root)); rc != 0 {
		return fmt.Errorf("rawmpi: MPI_Bcast returned %d", int(rc))
	}
	return nil
}

// Allgatherv is MPI_Allgatherv of send's bytes into recv on MPI_COMM_WORLD, rank p's counts[p]
// bytes after those of the ranks before it.
func Allgatherv(send, recv []byte, counts []int) error {
	cc := make([]C.int, 2*len(counts)) // counts, then displacements
	total := 0
	for p, n := range counts {
		cc[p], cc[len(counts)+p] = C.int(n), C.int(total)
		total += n
	}
	sp := unsafe.Pointer(&recv[0]) // valid memory even for a count of 0
	if len(send) > 0 {
		sp = unsafe.Pointer(&send[0])
	}
	if rc := C.raw_allgatherv(sp, C.int(len(send)), unsafe.Pointer(&recv[0]), &cc[0], &cc[len(counts)]); rc != 0 {
		return fmt.Errorf("rawmpi: MPI_Allgatherv returned %d", int(rc))
	}
	return nil
}

// ReduceScatter is MPI_Reduce_scatter(send, recv) on MPI_COMM_WORLD: rank p receives the
// reduction of counts[p] bytes of send, those after the ranks before it. MPI has no float16 or
// bfloat16.
func ReduceScatter(send, recv []byte, counts []int, dt backend.DType, op backend.ReduceOp) error {
	if err := supported(dt); err != nil {
		return err
	}
	cc := make([]C.int, len(counts))
	total := 0
	for p, n := range counts {
		if n%dt.Size() != 0 {
			return fmt.Errorf("rawmpi: reduce-scatter of %d bytes to rank %d, not whole %v elements", n, p, dt)
		}
		cc[p] = C.int(n / dt.Size()) // MPI counts elements
		total += n
	}
	if len(send) != total {
		return fmt.Errorf("rawmpi: reduce-scatter of %d bytes for counts totalling %d", len(send), total)
	}
	// An empty buffer is null with a count of 0 (a rank with no rows), which MPI never touches.
	if rc := C.raw_reduce_scatter(anyPointer(send, nil), anyPointer(recv, nil), &cc[0], C.int(dt), C.int(op)); rc != 0 {
		return fmt.Errorf("rawmpi: MPI_Reduce_scatter returned %d", int(rc))
	}
	return nil
}

// Alltoallv is MPI_Alltoallv of bytes on MPI_COMM_WORLD: sendCounts[p] bytes of send, those
// after the blocks for the ranks before p, go to rank p, and recv holds recvCounts[p] bytes from
// each rank p in rank order.
func Alltoallv(send []byte, sendCounts []int, recv []byte, recvCounts []int) error {
	size := len(sendCounts)
	if len(recvCounts) != size {
		return fmt.Errorf("rawmpi: alltoallv with %d send and %d receive counts", size, len(recvCounts))
	}
	cc := make([]C.int, 4*size) // send counts, send displacements, receive counts, receive displacements
	for i, counts := range [][]int{sendCounts, recvCounts} {
		cd, off := cc[2*size*i:], 0
		for p, n := range counts {
			cd[p], cd[size+p] = C.int(n), C.int(off)
			off += n
		}
		if buf := [2][]byte{send, recv}[i]; len(buf) != off {
			return fmt.Errorf("rawmpi: alltoallv buffer of %d bytes for counts totalling %d", len(buf), off)
		}
	}
	if rc := C.raw_alltoallv(anyPointer(send, recv), &cc[0], &cc[size], anyPointer(recv, send), &cc[2*size], &cc[3*size]); rc != 0 {
		return fmt.Errorf("rawmpi: MPI_Alltoallv returned %d", int(rc))
	}
	return nil
}

// anyPointer is b's memory, or where b is empty other's (MPI reads or writes none of it for
// counts of 0, but some implementations read the pointer), or nil where both are empty.
func anyPointer(b, other []byte) unsafe.Pointer {
	switch {
	case len(b) > 0:
		return unsafe.Pointer(&b[0])
	case len(other) > 0:
		return unsafe.Pointer(&other[0])
	}
	return nil
}

// timedKind is raw_time's kind for a reduction whose sum is kind sum: with average set, the one
// after it, the sum followed by a float32 scaling.
func timedKind(sum int, dt backend.DType, average bool) (int, error) {
	if !average {
		return sum, nil
	}
	if dt != backend.Float32 {
		return 0, fmt.Errorf("rawmpi: timing an average of %v: float32 only", dt)
	}
	return sum + 1, nil
}

// TimeAllreduce is the seconds an MPI_Allreduce sum from send into recv takes (MPI_IN_PLACE when
// they are the same slice), as one call, or when chunk > 0 as calls of at most chunk bytes each
// (whole elements), followed when average is set by a multiplication of every float32 of recv by
// 1/size: the best of batches batches of iters such allreduces made back to back in C, each batch
// timed as a mean; the slowest rank's figure, the same on every rank.
func TimeAllreduce(send, recv []byte, dt backend.DType, average bool, chunk, batches, iters int) (float64, error) {
	if err := supported(dt); err != nil {
		return 0, err
	}
	if len(send) != len(recv) || len(send) == 0 {
		return 0, fmt.Errorf("rawmpi: timing an allreduce of %d bytes into %d", len(send), len(recv))
	}
	kind, err := timedKind(0, dt, average)
	if err != nil {
		return 0, err
	}
	return float64(C.raw_time(C.int(kind), unsafe.Pointer(&send[0]), unsafe.Pointer(&recv[0]), C.int(len(send)/dt.Size()),
		C.int(dt), C.int(chunk/dt.Size()), C.int(batches), C.int(iters))), nil
}

// TimeSubsetAllreduce is TimeAllreduce (a sum out of place, one call) among the ranks of
// MPI_COMM_WORLD that call it as members, on a communicator split off for it: the reference for
// a process set's allreduce. Every rank calls it and gets the slowest member's figure.
func TimeSubsetAllreduce(member bool, send, recv []byte, dt backend.DType, batches, iters int) (float64, error) {
	if err := supported(dt); err != nil {
		return 0, err
	}
	if len(send) != len(recv) || len(send) == 0 {
		return 0, fmt.Errorf("rawmpi: timing an allreduce of %d bytes into %d", len(send), len(recv))
	}
	m := C.int(0)
	if member {
		m = 1
	}
	t := float64(C.raw_time_subset(m, 0, unsafe.Pointer(&send[0]), unsafe.Pointer(&recv[0]), C.int(len(send)/dt.Size()), C.int(dt), C.int(batches), C.int(iters)))
	if t < 0 {
		return 0, errors.New("rawmpi: MPI_Comm_split failed")
	}
	return t, nil
}

// TimeAllgather is TimeAllreduce for MPI_Allgather of send (the same length on every rank) into
// recv (size times as long).
func TimeAllgather(send, recv []byte, batches, iters int) (float64, error) {
	if len(send) == 0 || len(recv)%len(send) != 0 {
		return 0, fmt.Errorf("rawmpi: timing an allgather of %d bytes into %d", len(send), len(recv))
	}
	return float64(C.raw_time(2, unsafe.Pointer(&send[0]), unsafe.Pointer(&recv[0]), C.int(len(send)), 0, 0,
		C.int(batches), C.int(iters))), nil
}

// TimeBroadcast is TimeAllreduce for MPI_Bcast of buf from rank 0.
func TimeBroadcast(buf []byte, batches, iters int) (float64, error) {
	if len(buf) == 0 {
		return 0, fmt.Errorf("rawmpi: timing a broadcast of 0 bytes")
	}
	return float64(C.raw_time(3, unsafe.Pointer(&buf[0]), unsafe.Pointer(&buf[0]), C.int(len(buf)), 0, 0,
		C.int(batches), C.int(iters))), nil
}

// TimeReducescatter is TimeAllreduce for MPI_Reduce_scatter sum of send into recv in equal
// blocks (send is size times as long as recv, every rank's block recv's length), followed when
// average is set by a multiplication of every float32 of recv by 1/size.
func TimeReducescatter(send, recv []byte, dt backend.DType, average bool, batches, iters int) (float64, error) {
	if err := supported(dt); err != nil {
		return 0, err
	}
	if len(recv) == 0 || len(recv)%dt.Size() != 0 || len(send) != len(recv)*int(C.raw_size()) {
		return 0, fmt.Errorf("rawmpi: timing a reduce-scatter of %d bytes into blocks of %d", len(send), len(recv))
	}
	kind, err := timedKind(4, dt, average)
	if err != nil {
		return 0, err
	}
	return float64(C.raw_time(C.int(kind), unsafe.Pointer(&send[0]), unsafe.Pointer(&recv[0]), C.int(len(recv)/dt.Size()),
		C.int(dt), 0, C.int(batches), C.int(iters))), nil
}

// TimeAlltoall is TimeAllreduce for MPI_Alltoall of send into recv (as long as send), an equal
// block of len(send)/size bytes to and from every rank.
func TimeAlltoall(send, recv []byte, batches, iters int) (float64, error) {
	size := int(C.raw_size())
	if len(send) == 0 || len(send) != len(recv) || len(send)%size != 0 {
		return 0, fmt.Errorf("rawmpi: timing an all-to-all of %d bytes into %d among %d ranks", len(send), len(recv), size)
	}
	return float64(C.raw_time(6, unsafe.Pointer(&send[0]), unsafe.Pointer(&recv[0]), C.int(len(send)/size), 0, 0,
		C.int(batches), C.int(iters))), nil
}
