// The arithmetic of package mpi's allreduce over shared memory (shm.go): plain C so that the
// compiler vectorizes it; no MPI in here.
#ifndef GOROVOD_SHM_REDUCE_H
#define GOROVOD_SHM_REDUCE_H

#include <stddef.h>
#include <stdint.h>

// Element types, in the numbering of horovod/backend.DType (those the sum supports).
enum { SHM_UINT8 = 1, SHM_INT8 = 2, SHM_INT32 = 3, SHM_INT64 = 4, SHM_FLOAT32 = 6, SHM_FLOAT64 = 7 };

// gorovod_shm_sum sums elements lo..hi-1 of the k buffers in bufs, in buffer order, and writes
// the sum over those elements of every buffer. It returns -1 for a dtype it does not support.
int gorovod_shm_sum(void *const *bufs, int k, size_t lo, size_t hi, int dtype);

#endif
