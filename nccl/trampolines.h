// Calls through function pointers obtained with dlsym. cgo cannot call a C function pointer
// directly, so each distinct C signature used by the binding has one trampoline here. The
// signatures are written without NCCL or CUDA headers: every handle is an opaque pointer,
// every enum an int (cudaError_t, ncclResult_t, ncclDataType_t and ncclRedOp_t are all
// int-sized enums; nccl.h keeps ncclRedOp_t int-sized on purpose for ABI stability).
#ifndef GOROVOD_NCCL_TRAMPOLINES_H
#define GOROVOD_NCCL_TRAMPOLINES_H

#include <stddef.h>

// ncclUniqueId: struct { char internal[NCCL_UNIQUE_ID_BYTES = 128]; }, passed by value to
// ncclCommInitRank, so it needs a real C type of the same size and layout.
typedef struct { char internal[128]; } gorovod_unique_id;

static inline int gr_call_v(void *f) { return ((int (*)(void))f)(); }
static inline int gr_call_i(void *f, int a) { return ((int (*)(int))f)(a); }
static inline int gr_call_pi(void *f, int *a) { return ((int (*)(int *))f)(a); }
static inline int gr_call_p(void *f, void *a) { return ((int (*)(void *))f)(a); }
static inline int gr_call_p_pi(void *f, void *a, int *b) { return ((int (*)(void *, int *))f)(a, b); }
static inline const char *gr_call_s_i(void *f, int a) { return ((const char *(*)(int))f)(a); }
static inline const char *gr_call_s_p(void *f, void *a) { return ((const char *(*)(void *))f)(a); }
static inline int gr_call_pp_z(void *f, void **a, size_t b) { return ((int (*)(void **, size_t))f)(a, b); }
static inline int gr_call_pp_z_u(void *f, void **a, size_t b, unsigned c) {
	return ((int (*)(void **, size_t, unsigned))f)(a, b, c);
}
static inline int gr_call_pp_u(void *f, void **a, unsigned b) { return ((int (*)(void **, unsigned))f)(a, b); }
static inline int gr_call_pz_pz(void *f, size_t *a, size_t *b) { return ((int (*)(size_t *, size_t *))f)(a, b); }
static inline int gr_call_s_i_i(void *f, char *a, int b, int c) { return ((int (*)(char *, int, int))f)(a, b, c); }
// cudaMemcpyAsync(dst, src, count, kind, stream)
static inline int gr_call_memcpy(void *f, void *dst, const void *src, size_t n, int kind, void *stream) {
	return ((int (*)(void *, const void *, size_t, int, void *))f)(dst, src, n, kind, stream);
}
// ncclCommInitRank(&comm, nranks, id, rank)
static inline int gr_call_init_rank(void *f, void **comm, int nranks, gorovod_unique_id *id, int rank) {
	return ((int (*)(void **, int, gorovod_unique_id, int))f)(comm, nranks, *id, rank);
}
// ncclAllReduce(send, recv, count, datatype, op, comm, stream) and
// ncclBroadcast(send, recv, count, datatype, root, comm, stream) share one shape.
static inline int gr_call_coll_ii(void *f, const void *send, void *recv, size_t n, int dt, int x, void *comm,
				  void *stream) {
	return ((int (*)(const void *, void *, size_t, int, int, void *, void *))f)(send, recv, n, dt, x, comm, stream);
}
// ncclAllGather(send, recv, sendcount, datatype, comm, stream)
static inline int gr_call_coll_i(void *f, const void *send, void *recv, size_t n, int dt, void *comm, void *stream) {
	return ((int (*)(const void *, void *, size_t, int, void *, void *))f)(send, recv, n, dt, comm, stream);
}

#endif
