#include "mpi_shim.h"

#include <mpi.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#ifdef __linux__
#include <sys/prctl.h>
#endif

// An hvd_comm holds an MPI_Comm for Go, which cannot name one portably (MPI handles are pointers
// in OpenMPI and integers elsewhere). world is the job's (MPI_COMM_WORLD duplicated);
// hvd_mpi_split allocates a process set's.
struct hvd_comm {
	MPI_Comm comm;
};
static hvd_comm world = {MPI_COMM_NULL};
static MPI_Datatype half_type = MPI_DATATYPE_NULL, bf16_type = MPI_DATATYPE_NULL;
static MPI_Op half_sum = MPI_OP_NULL, half_min = MPI_OP_NULL, half_max = MPI_OP_NULL, half_prod = MPI_OP_NULL;
static MPI_Op byte_sum = MPI_OP_NULL;
static int we_initialized = 0;
static int world_rank = 0, world_size = 1;

// The roll call of hvd_mpi_allgatherv (see mpi_shim.h): reached[r] is set once this rank knows
// rank r has entered the allgather in progress, tracking while one is in progress. Written by the
// thread making MPI calls, read by any thread (hvd_mpi_reached), hence the atomics.
static int *reached = NULL;
static int tracking = 0;
static MPI_Request *notes = NULL; // receives first, then sends
static int *note_from = NULL;     // the rank each receive in notes is from
// Notes carry a tag of their round, so that a note left over from an earlier round (sent by a
// rank that waited to a rank that did not, and so never received) never counts for a later one.
// A leftover is at most one round old when it is drained, far from the HVD_NOTE_TAGS rounds after
// which a tag comes back.
enum { HVD_NOTE_TAG_BASE = 0x4000, HVD_NOTE_TAGS = 0x4000 };
static uint64_t rounds = 0, roll_calls = 0; // allgathers, and those that took a roll call

// The 16-bit float operators call back into Go (packages fp16, with its F16C path, and bf16) once
// per block that MPI hands them, so the conversion code exists once. Each widens both operands to
// float32, combines them and narrows the result with round-to-nearest-even, as Horovod's float16
// sum does. float16 and bfloat16 share the operators: the datatype MPI passes tells them apart.
extern void hvdHalfReduce(void *in, void *inout, int len, int op, int bfloat16);

static void half_sum_fn(void *in, void *inout, int *len, MPI_Datatype *dt) {
	hvdHalfReduce(in, inout, *len, HVD_SUM, *dt == bf16_type);
}

static void half_min_fn(void *in, void *inout, int *len, MPI_Datatype *dt) {
	hvdHalfReduce(in, inout, *len, HVD_MIN, *dt == bf16_type);
}

static void half_max_fn(void *in, void *inout, int *len, MPI_Datatype *dt) {
	hvdHalfReduce(in, inout, *len, HVD_MAX, *dt == bf16_type);
}

static void half_prod_fn(void *in, void *inout, int *len, MPI_Datatype *dt) {
	hvdHalfReduce(in, inout, *len, HVD_PROD, *dt == bf16_type);
}

// The int8 and uint8 sum wraps around, as C's, TensorFlow's, NCCL's and the shared-memory sum's
// (shm_reduce.c) do: OpenMPI 4.1's AVX operators (op/avx) saturate 8-bit sums instead
// (open-mpi/ompi#8045, "wontfix"), which made a short tensor's sum differ from a long one's. Two's
// complement makes the same bytes right for both types.
static void byte_sum_fn(void *in, void *inout, int *len, MPI_Datatype *dt) {
	const uint8_t *a = in;
	uint8_t *b = inout;
	for (int i = 0; i < *len; i++) b[i] = (uint8_t)(a[i] + b[i]);
}

// topology fills in this process's place in c, with Horovod's meanings: its rank and size, then
// among the ranks of c sharing memory with it (local) and among those with its local rank
// (cross). It is a collective of c.
static int topology(MPI_Comm c, hvd_topology *topo) {
	int err;
	MPI_Comm_rank(c, &topo->rank);
	MPI_Comm_size(c, &topo->size);
	MPI_Comm local, cross;
	if ((err = MPI_Comm_split_type(c, MPI_COMM_TYPE_SHARED, topo->rank, MPI_INFO_NULL, &local)) != MPI_SUCCESS) return err;
	MPI_Comm_rank(local, &topo->local_rank);
	MPI_Comm_size(local, &topo->local_size);
	MPI_Comm_free(&local);
	if ((err = MPI_Comm_split(c, topo->local_rank, topo->rank, &cross)) != MPI_SUCCESS) return err;
	MPI_Comm_rank(cross, &topo->cross_rank);
	MPI_Comm_size(cross, &topo->cross_size);
	MPI_Comm_free(&cross);
	return MPI_SUCCESS;
}

int hvd_mpi_init(int multiple, hvd_topology *topo) {
	int err, initialized = 0;
	MPI_Initialized(&initialized);
	if (!initialized) {
		// Without process sets no two MPI calls of this process overlap: horovod's loop or this
		// thread makes them. A process set's calls overlap the job's and the other sets'.
		err = MPI_Init_thread(NULL, NULL, multiple ? MPI_THREAD_MULTIPLE : MPI_THREAD_SERIALIZED, &topo->thread_level);
		if (err != MPI_SUCCESS) return err;
		we_initialized = 1;
	} else {
		MPI_Query_thread(&topo->thread_level);
	}
	if ((err = MPI_Comm_dup(MPI_COMM_WORLD, &world.comm)) != MPI_SUCCESS) return err;
	// Errors come back as codes that Go turns into errors, instead of MPI aborting the job.
	MPI_Comm_set_errhandler(world.comm, MPI_ERRORS_RETURN);
	if ((err = topology(world.comm, topo)) != MPI_SUCCESS) return err;
	world_rank = topo->rank;
	world_size = topo->size;
	reached = calloc(world_size, sizeof *reached);
	notes = calloc(2 * world_size, sizeof *notes);
	note_from = calloc(world_size, sizeof *note_from);
	if (reached == NULL || notes == NULL || note_from == NULL) return MPI_ERR_NO_MEM;

	if ((err = MPI_Type_contiguous(2, MPI_BYTE, &half_type)) != MPI_SUCCESS) return err;
	MPI_Type_commit(&half_type);
	if ((err = MPI_Type_contiguous(2, MPI_BYTE, &bf16_type)) != MPI_SUCCESS) return err;
	MPI_Type_commit(&bf16_type);
	MPI_Op_create(half_sum_fn, 1, &half_sum);
	MPI_Op_create(half_min_fn, 1, &half_min);
	MPI_Op_create(half_max_fn, 1, &half_max);
	MPI_Op_create(half_prod_fn, 1, &half_prod);
	MPI_Op_create(byte_sum_fn, 1, &byte_sum);
	return MPI_SUCCESS;
}

static MPI_Datatype mpi_type(int dtype) {
	switch (dtype) {
	case HVD_UINT8: return MPI_UINT8_T;
	case HVD_INT8: return MPI_INT8_T;
	case HVD_INT32: return MPI_INT32_T;
	case HVD_INT64: return MPI_INT64_T;
	case HVD_FLOAT16: return half_type;
	case HVD_FLOAT32: return MPI_FLOAT;
	case HVD_FLOAT64: return MPI_DOUBLE;
	case HVD_BFLOAT16: return bf16_type;
	}
	return MPI_DATATYPE_NULL;
}

static MPI_Op mpi_op(int dtype, int op) {
	if (dtype == HVD_FLOAT16 || dtype == HVD_BFLOAT16) {
		switch (op) {
		case HVD_SUM: return half_sum;
		case HVD_MIN: return half_min;
		case HVD_MAX: return half_max;
		case HVD_PROD: return half_prod;
		}
		return MPI_OP_NULL;
	}
	if (op == HVD_SUM && (dtype == HVD_INT8 || dtype == HVD_UINT8)) return byte_sum;
	switch (op) {
	case HVD_SUM: return MPI_SUM;
	case HVD_MIN: return MPI_MIN;
	case HVD_MAX: return MPI_MAX;
	case HVD_PROD: return MPI_PROD;
	}
	return MPI_OP_NULL;
}

hvd_comm *hvd_mpi_world(void) { return &world; }

int hvd_mpi_split(const hvd_comm *parent, int member, hvd_comm **out, hvd_topology *topo) {
	int err, rank;
	MPI_Comm c;
	*out = NULL;
	MPI_Comm_rank(parent->comm, &rank);
	if ((err = MPI_Comm_split(parent->comm, member ? 0 : MPI_UNDEFINED, rank, &c)) != MPI_SUCCESS) return err;
	if (c == MPI_COMM_NULL) return MPI_SUCCESS;
	// As the job's: errors come back as codes instead of aborting the job.
	MPI_Comm_set_errhandler(c, MPI_ERRORS_RETURN);
	hvd_comm *h = NULL;
	// The topology first: it is a collective of c, which every member then makes alike.
	if ((err = topology(c, topo)) == MPI_SUCCESS && (h = malloc(sizeof *h)) == NULL) err = MPI_ERR_NO_MEM;
	if (err != MPI_SUCCESS) {
		MPI_Comm_free(&c);
		return err;
	}
	h->comm = c;
	*out = h;
	return MPI_SUCCESS;
}

int hvd_mpi_comm_free(hvd_comm *c) {
	int err = MPI_Comm_free(&c->comm);
	free(c);
	return err;
}

int hvd_mpi_allreduce(const hvd_comm *c, const void *send, void *recv, int count, int dtype, int op) {
	MPI_Datatype t = mpi_type(dtype);
	MPI_Op o = mpi_op(dtype, op);
	if (t == MPI_DATATYPE_NULL) return MPI_ERR_TYPE;
	if (o == MPI_OP_NULL) return MPI_ERR_OP;
	return MPI_Allreduce(send == recv ? MPI_IN_PLACE : send, recv, count, t, o, c->comm);
}

int hvd_mpi_bcast(const hvd_comm *c, void *buf, int count, int root) { return MPI_Bcast(buf, count, MPI_BYTE, root, c->comm); }

int hvd_mpi_ibcast(void *buf, int count, int root, void **req) {
	*req = NULL;
	MPI_Request *r = malloc(sizeof *r);
	if (r == NULL) return MPI_ERR_NO_MEM;
	int err = MPI_Ibcast(buf, count, MPI_BYTE, root, world.comm, r);
	if (err != MPI_SUCCESS) {
		free(r);
		return err;
	}
	*req = r;
	return MPI_SUCCESS;
}

int hvd_mpi_wait(void *req) {
	if (req == NULL) return MPI_SUCCESS;
	int err = MPI_Wait((MPI_Request *)req, MPI_STATUS_IGNORE);
	free(req);
	return err;
}

static int64_t now_ns(void) {
	struct timespec t;
	clock_gettime(CLOCK_MONOTONIC, &t);
	return (int64_t)t.tv_sec * 1000000000 + t.tv_nsec;
}

// nap is one sleep of a sleeping wait: *pause, which starts at HVD_WAIT_FIRST_SLEEP_NS and
// doubles with every nap up to HVD_WAIT_MAX_SLEEP_NS.
static void nap(long *pause) {
#ifdef PR_SET_TIMERSLACK
	// Linux's default 50 us timer slack would stretch the first 10 us sleeps sixfold. The slack is
	// per thread, and horovod's loop may run on any of Go's threads: set it on this one before its
	// first sleep.
	if (*pause == HVD_WAIT_FIRST_SLEEP_NS) prctl(PR_SET_TIMERSLACK, 1000UL, 0, 0, 0);
#endif
	struct timespec ts = {0, *pause};
	nanosleep(&ts, NULL);
	*pause = *pause * 2 < HVD_WAIT_MAX_SLEEP_NS ? *pause * 2 : HVD_WAIT_MAX_SLEEP_NS;
}

static int note_tag(uint64_t round) { return HVD_NOTE_TAG_BASE + (int)(round % HVD_NOTE_TAGS); }

// is_partner: this rank exchanges notes with rank r (rank 0 with every rank, the others with 0).
static int is_partner(int r) { return r != world_rank && (world_rank == 0 || r == 0); }

// roll_call posts this rank's notes for the round in progress: rank 0 exchanges an empty message
// with every other rank, the others with rank 0 only, so a roll call costs 2(size-1) empty
// messages. It returns how many receives it posted at the start of notes (the sends follow them).
static int roll_call(int *posted) {
	int n = 0, err, tag = note_tag(rounds);
	for (int r = 0; r < world_size; r++) {
		if (!is_partner(r)) continue;
		note_from[n] = r;
		if ((err = MPI_Irecv(NULL, 0, MPI_BYTE, r, tag, world.comm, &notes[n])) != MPI_SUCCESS) return err;
		n++;
	}
	for (int i = 0; i < n; i++) {
		if ((err = MPI_Isend(NULL, 0, MPI_BYTE, note_from[i], tag, world.comm, &notes[n + i])) != MPI_SUCCESS) return err;
	}
	*posted = n;
	__atomic_add_fetch(&roll_calls, 1, __ATOMIC_RELAXED);
	return MPI_SUCCESS;
}

// end_roll_call completes this rank's notes once its round is over: a partner that did not wait
// never sent the note this rank waits for, so the receives still open are cancelled; and it may
// never receive this rank's note (drain_notes discards it), so the sends complete on their own.
static int end_roll_call(int nrecv) {
	int err;
	for (int i = 0; i < nrecv; i++) {
		int done = 0;
		if ((err = MPI_Test(&notes[i], &done, MPI_STATUS_IGNORE)) != MPI_SUCCESS) return err;
		if (!done && (err = MPI_Cancel(&notes[i])) != MPI_SUCCESS) return err;
		if ((err = MPI_Request_free(&notes[nrecv + i])) != MPI_SUCCESS) return err;
	}
	return MPI_Waitall(nrecv, notes, MPI_STATUSES_IGNORE);
}

// drain_notes receives the notes partners sent for rounds up to this one that this rank did not
// wait for, so that they do not pile up in MPI's queue of unexpected messages. It stops at a note
// for the next round (a partner may already be waiting in it), or at a message that is no note:
// messages from one sender arrive in the order they were sent, so a later round drains the rest.
static int drain_notes(void) {
	int err, next = note_tag(rounds + 1);
	for (int r = 0; r < world_size; r++) {
		if (!is_partner(r)) continue;
		for (;;) {
			int found = 0;
			MPI_Status st;
			if ((err = MPI_Iprobe(r, MPI_ANY_TAG, world.comm, &found, &st)) != MPI_SUCCESS) return err;
			if (!found || st.MPI_TAG == next || st.MPI_TAG < HVD_NOTE_TAG_BASE || st.MPI_TAG >= HVD_NOTE_TAG_BASE + HVD_NOTE_TAGS) break;
			if ((err = MPI_Recv(NULL, 0, MPI_BYTE, r, st.MPI_TAG, world.comm, MPI_STATUS_IGNORE)) != MPI_SUCCESS) return err;
		}
	}
	return MPI_SUCCESS;
}

// test_round tests the allgather and the notes received so far.
static int test_round(MPI_Request *req, int nrecv, int *done) {
	int err, count, idx[nrecv > 0 ? nrecv : 1];
	if ((err = MPI_Test(req, done, MPI_STATUS_IGNORE)) != MPI_SUCCESS) return err;
	if (nrecv == 0) return MPI_SUCCESS;
	if ((err = MPI_Testsome(nrecv, notes, &count, idx, MPI_STATUSES_IGNORE)) != MPI_SUCCESS) return err;
	for (int i = 0; count != MPI_UNDEFINED && i < count; i++) __atomic_store_n(&reached[note_from[idx[i]]], 1, __ATOMIC_RELEASE);
	return MPI_SUCCESS;
}

// wait_round completes req as described at hvd_mpi_allgatherv. MPI_Test drives MPI's progress
// engine, so a collective advances only while this thread tests it: fine for messages that each
// go out in one piece when posted, which is what the sleeping wait is used for. The roll call
// starts when the spin ends: a round whose ranks all arrive within it, the common case of a busy
// job, costs no message beyond the allgather's own.
static int wait_round(MPI_Request *req, int sleep) {
	int done = 0, err, nrecv = 0, called = 0;
	const int64_t spin_until = now_ns() + HVD_WAIT_SPIN_NS;
	long pause = HVD_WAIT_FIRST_SLEEP_NS;
	for (;;) {
		if ((err = test_round(req, nrecv, &done)) != MPI_SUCCESS) return err;
		if (done) break;
		if (now_ns() < spin_until) continue;
		if (!called) {
			if ((err = roll_call(&nrecv)) != MPI_SUCCESS) return err;
			called = 1;
		}
		if (sleep) nap(&pause);
	}
	__atomic_store_n(&tracking, 0, __ATOMIC_RELEASE);
	if (called && (err = end_roll_call(nrecv)) != MPI_SUCCESS) return err;
	return drain_notes();
}

int hvd_mpi_allgatherv(const void *send, int send_count, void *recv, const int *counts, const int *displs, int sleep) {
	MPI_Request req;
	int err;
	__atomic_add_fetch(&rounds, 1, __ATOMIC_RELAXED);
	for (int r = 0; r < world_size; r++) __atomic_store_n(&reached[r], r == world_rank, __ATOMIC_RELEASE);
	__atomic_store_n(&tracking, 1, __ATOMIC_RELEASE);
	err = MPI_Iallgatherv(send, send_count, MPI_BYTE, recv, counts, displs, MPI_BYTE, world.comm, &req);
	if (err == MPI_SUCCESS) err = wait_round(&req, sleep);
	// A round that failed is over too: its roll call must not read as one in progress.
	__atomic_store_n(&tracking, 0, __ATOMIC_RELEASE);
	return err;
}

int hvd_mpi_allgatherv_sleeping(const hvd_comm *c, const void *send, int send_count, void *recv, const int *counts, const int *displs) {
	MPI_Request req;
	int err = MPI_Iallgatherv(send, send_count, MPI_BYTE, recv, counts, displs, MPI_BYTE, c->comm, &req);
	if (err != MPI_SUCCESS) return err;
	const int64_t spin_until = now_ns() + HVD_WAIT_SPIN_NS;
	long pause = HVD_WAIT_FIRST_SLEEP_NS;
	for (;;) {
		int done = 0;
		if ((err = MPI_Test(&req, &done, MPI_STATUS_IGNORE)) != MPI_SUCCESS) return err;
		if (done) return MPI_SUCCESS;
		if (now_ns() >= spin_until) nap(&pause);
	}
}

int hvd_mpi_allgatherv_blocking(const hvd_comm *c, const void *send, int send_count, void *recv, const int *counts, const int *displs) {
	return MPI_Allgatherv(send, send_count, MPI_BYTE, recv, counts, displs, MPI_BYTE, c->comm);
}

int hvd_mpi_reduce_scatter(const hvd_comm *c, const void *send, void *recv, const int *counts, int dtype, int op) {
	MPI_Datatype t = mpi_type(dtype);
	MPI_Op o = mpi_op(dtype, op);
	if (t == MPI_DATATYPE_NULL) return MPI_ERR_TYPE;
	if (o == MPI_OP_NULL) return MPI_ERR_OP;
	return MPI_Reduce_scatter(send, recv, counts, t, o, c->comm);
}

int hvd_mpi_alltoallv(const hvd_comm *c, const void *send, const int *send_counts, const int *send_displs, void *recv, const int *recv_counts, const int *recv_displs) {
	return MPI_Alltoallv(send, send_counts, send_displs, MPI_BYTE, recv, recv_counts, recv_displs, MPI_BYTE, c->comm);
}

void hvd_mpi_roll_call_stats(uint64_t *allgathers, uint64_t *called) {
	*allgathers = __atomic_load_n(&rounds, __ATOMIC_RELAXED);
	*called = __atomic_load_n(&roll_calls, __ATOMIC_RELAXED);
}

int hvd_mpi_tracking(void) { return __atomic_load_n(&tracking, __ATOMIC_ACQUIRE); }

int hvd_mpi_reached(int rank) { return reached == NULL ? 0 : __atomic_load_n(&reached[rank], __ATOMIC_ACQUIRE); }

int hvd_mpi_barrier(const hvd_comm *c) { return MPI_Barrier(c->comm); }

void hvd_mpi_abort(int code) { MPI_Abort(world.comm == MPI_COMM_NULL ? MPI_COMM_WORLD : world.comm, code); }

int hvd_mpi_finalize(void) {
	MPI_Op_free(&half_sum);
	MPI_Op_free(&half_min);
	MPI_Op_free(&half_max);
	MPI_Op_free(&half_prod);
	MPI_Op_free(&byte_sum);
	MPI_Type_free(&half_type);
	MPI_Type_free(&bf16_type);
	MPI_Comm_free(&world.comm);
	__atomic_store_n(&tracking, 0, __ATOMIC_RELEASE);
	free(reached);
	free(notes);
	free(note_from);
	reached = NULL;
	if (!we_initialized) return MPI_SUCCESS;
	return MPI_Finalize();
}

void hvd_mpi_error_string(int code, char *buf, int len) {
	int n = 0;
	char tmp[MPI_MAX_ERROR_STRING];
	if (MPI_Error_string(code, tmp, &n) != MPI_SUCCESS) n = 0;
	if (n >= len) n = len - 1;
	memcpy(buf, tmp, n);
	buf[n] = 0;
}

int hvd_mpi_thread_serialized(void) { return MPI_THREAD_SERIALIZED; }

int hvd_mpi_thread_multiple(void) { return MPI_THREAD_MULTIPLE; }
