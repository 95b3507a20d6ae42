// C side of package mpi: thin wrappers that keep MPI handles (which are pointers in OpenMPI and
// integers elsewhere) out of Go, and the float16 and bfloat16 reduction operators.
#ifndef GOROVOD_MPI_SHIM_H
#define GOROVOD_MPI_SHIM_H

#include <stddef.h>
#include <stdint.h>

// Element types, in the numbering of horovod/backend.DType.
enum { HVD_UINT8 = 1, HVD_INT8, HVD_INT32, HVD_INT64, HVD_FLOAT16, HVD_FLOAT32, HVD_FLOAT64, HVD_BFLOAT16 };
// Reductions, in the numbering of horovod/backend.ReduceOp.
enum { HVD_SUM = 1, HVD_MIN, HVD_MAX, HVD_PROD };

typedef struct {
	int rank, size, local_rank, local_size, cross_rank, cross_size;
	int thread_level;
} hvd_topology;

// hvd_comm is a communicator: the job's (hvd_mpi_world) or a process set's (hvd_mpi_split).
typedef struct hvd_comm hvd_comm;

// hvd_mpi_init initializes MPI (unless already initialized) asking for MPI_THREAD_MULTIPLE where
// multiple is set and MPI_THREAD_SERIALIZED otherwise, duplicates MPI_COMM_WORLD with
// MPI_ERRORS_RETURN, splits the local and cross communicators and creates the float16 and
// bfloat16 types and their ops.
int hvd_mpi_init(int multiple, hvd_topology *topo);
// hvd_mpi_world is the job's communicator, valid from hvd_mpi_init to hvd_mpi_finalize.
hvd_comm *hvd_mpi_world(void);
// hvd_mpi_split is MPI_Comm_split of parent, a collective of its ranks: the ranks with member set
// get a communicator of their own in *out, ordered as in parent, with MPI_ERRORS_RETURN and their
// place in it in *topo (as hvd_mpi_init's); the others get NULL. hvd_mpi_comm_free frees it.
int hvd_mpi_split(const hvd_comm *parent, int member, hvd_comm **out, hvd_topology *topo);
int hvd_mpi_comm_free(hvd_comm *c);
// The collectives below (but hvd_mpi_ibcast and hvd_mpi_allgatherv, the job's alone) are over c.
int hvd_mpi_allreduce(const hvd_comm *c, const void *send, void *recv, int count, int dtype, int op);
int hvd_mpi_bcast(const hvd_comm *c, void *buf, int count, int root);
// hvd_mpi_ibcast starts MPI_Ibcast of count bytes; *req receives a handle for hvd_mpi_wait,
// which waits for it and frees it (also after a failed start, where *req is NULL and it does
// nothing).
int hvd_mpi_ibcast(void *buf, int count, int root, void **req);
int hvd_mpi_wait(void *req);
// hvd_mpi_allgatherv starts MPI_Iallgatherv and tests it until it completes. With sleep 0 it
// tests without pause, as a blocking MPI_Allgatherv polls. Otherwise it tests for
// HVD_WAIT_SPIN_NS without pause (a peer that is already there answers at MPI's latency), then
// with sleeps that double from HVD_WAIT_FIRST_SLEEP_NS to HVD_WAIT_MAX_SLEEP_NS, so that a rank
// waiting for a peer still computing leaves its core to that computation instead of polling in
// MPI's progress engine. From the end of the spin on, whatever the wait, it keeps a roll call:
// every rank that waits tells rank 0 that it has entered, and rank 0 tells every rank, so that
// hvd_mpi_reached can say who is late. A round whose ranks all arrive within the spin sends no
// note.
int hvd_mpi_allgatherv(const void *send, int send_count, void *recv, const int *counts, const int *displs, int sleep);
// hvd_mpi_allgatherv_sleeping is hvd_mpi_allgatherv's sleeping wait without its roll call, whose
// state is the job's communicator's: a process set's negotiation waits with it.
int hvd_mpi_allgatherv_sleeping(const hvd_comm *c, const void *send, int send_count, void *recv, const int *counts, const int *displs);
// hvd_mpi_allgatherv_blocking is MPI_Allgatherv of bytes: no roll call, MPI's own wait.
int hvd_mpi_allgatherv_blocking(const hvd_comm *c, const void *send, int send_count, void *recv, const int *counts, const int *displs);
// hvd_mpi_reduce_scatter is MPI_Reduce_scatter: counts[r] elements of dtype, reduced with op as
// hvd_mpi_allreduce reduces them, to rank r.
int hvd_mpi_reduce_scatter(const hvd_comm *c, const void *send, void *recv, const int *counts, int dtype, int op);
// hvd_mpi_alltoallv is MPI_Alltoallv of bytes.
int hvd_mpi_alltoallv(const hvd_comm *c, const void *send, const int *send_counts, const int *send_displs, void *recv, const int *recv_counts, const int *recv_displs);
// hvd_mpi_roll_call_stats reads how many allgathers this process made and how many of them
// took a roll call. Any thread may call it.
void hvd_mpi_roll_call_stats(uint64_t *allgathers, uint64_t *called);
// hvd_mpi_tracking is 1 while hvd_mpi_allgatherv waits, when hvd_mpi_reached describes its round.
int hvd_mpi_tracking(void);
// hvd_mpi_reached is 1 when this rank knows that rank has entered the allgather in progress.
// Any thread may call these two.
int hvd_mpi_reached(int rank);
enum { HVD_WAIT_SPIN_NS = 50000, HVD_WAIT_FIRST_SLEEP_NS = 10000, HVD_WAIT_MAX_SLEEP_NS = 500000 };
int hvd_mpi_barrier(const hvd_comm *c);
void hvd_mpi_abort(int code);
// hvd_mpi_thread_serialized is MPI_THREAD_SERIALIZED, the level this package needs;
// hvd_mpi_thread_multiple is MPI_THREAD_MULTIPLE, the level its process sets need.
int hvd_mpi_thread_serialized(void);
int hvd_mpi_thread_multiple(void);
int hvd_mpi_finalize(void);
// hvd_mpi_error_string writes MPI's text for an error code into buf (NUL-terminated).
void hvd_mpi_error_string(int code, char *buf, int len);

#endif
