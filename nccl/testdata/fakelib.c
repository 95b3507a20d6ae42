// A stand-in for libcudart and libnccl, built by the tests with gcc, so that the CPU tests can
// drive the binding's dlopen, symbol lookup, argument checks and error handling on machines
// without CUDA. It is NOT a CUDA or NCCL implementation: it reduces nothing. Memory
// "on the device" is host memory here, so the staging copies' offsets and bounds can be
// checked byte for byte; whether real CUDA and NCCL do the right thing is checked on a GPU
// by scripts/gpu-check.sh. The collectives behave as in a communicator of one rank: they copy
// send to recv when the two differ (with one rank there is nothing to reduce). Behaviour is chosen per test through environment variables:
//   FAKE_CUDA_DEVICES   number of devices cudaGetDeviceCount reports (default 0)
//   FAKE_NCCL_VERSION   version ncclGetVersion reports (default 23203)
//   FAKE_NCCL_ASYNC_ERR the ncclResult_t ncclCommGetAsyncError reports
//   FAKE_FAIL           "fn:code,fn:code": the named functions return that error code
//                       (e.g. "cudaGetDeviceCount:100,ncclAllReduce:5")
// Build with -DFAKE_CUDA or -DFAKE_NCCL; -DFAKE_OMIT_SYMBOL leaves out one required symbol.
#include <stdlib.h>
#include <string.h>
#include <stdio.h>

static int env_int(const char *name, int def) {
	const char *v = getenv(name);
	return v && *v ? atoi(v) : def;
}

// fail returns the code FAKE_FAIL gives fn, or 0.
static int fail(const char *fn) {
	const char *v = getenv("FAKE_FAIL");
	size_t n = strlen(fn);
	for (const char *p = v; p && *p;) {
		if (strncmp(p, fn, n) == 0 && p[n] == ':') return atoi(p + n + 1);
		p = strchr(p, ',');
		if (p) p++;
	}
	return 0;
}
#define FAIL(fn) do { int e_ = fail(fn); if (e_) return e_; } while (0)

#ifdef FAKE_CUDA
static const char *cuda_name(int e) {
	switch (e) {
	case 0: return "cudaSuccess";
	case 1: return "cudaErrorInvalidValue";
	case 2: return "cudaErrorMemoryAllocation";
	case 35: return "cudaErrorInsufficientDriver";
	case 100: return "cudaErrorNoDevice";
	case 101: return "cudaErrorInvalidDevice";
	}
	return "cudaErrorUnknown";
}
const char *cudaGetErrorName(int e) { return cuda_name(e); }
const char *cudaGetErrorString(int e) {
	static char buf[64];
	snprintf(buf, sizeof buf, "fake message for %s", cuda_name(e));
	return buf;
}
int cudaGetDeviceCount(int *n) {
	*n = 0;
	FAIL("cudaGetDeviceCount");
	*n = env_int("FAKE_CUDA_DEVICES", 0);
	return 0;
}
int cudaSetDevice(int d) { FAIL("cudaSetDevice"); return d >= 0 && d < env_int("FAKE_CUDA_DEVICES", 0) ? 0 : 101; }
int cudaRuntimeGetVersion(int *v) { *v = 12090; return 0; }
int cudaDriverGetVersion(int *v) { *v = 0; return 0; }
int cudaMalloc(void **p, size_t n) {
	FAIL("cudaMalloc");
	*p = malloc(n);
	return 0;
}
int cudaFree(void *p) { free(p); return 0; }
int cudaHostAlloc(void **p, size_t n, unsigned flags) {
	FAIL("cudaHostAlloc");
	if (flags != 1) return 1; // the binding always asks for cudaHostAllocPortable
	*p = malloc(n);
	return 0;
}
int cudaFreeHost(void *p) { free(p); return 0; }
int cudaMemGetInfo(size_t *f, size_t *t) {
	FAIL("cudaMemGetInfo");
	*f = 1 << 20;
	*t = 2 << 20;
	return 0;
}
int cudaMemcpyAsync(void *dst, const void *src, size_t n, int kind, void *stream) {
	if (kind != 1 && kind != 2) return 1;
	if (stream == NULL) return 1; // the binding never uses the default stream
	memcpy(dst, src, n);
	return 0;
}
static int fake_stream;
int cudaStreamCreateWithFlags(void **s, unsigned flags) {
	FAIL("cudaStreamCreateWithFlags");
	*s = &fake_stream;
	return flags == 1 ? 0 : 1;
}
int cudaStreamSynchronize(void *s) { return s == &fake_stream ? 0 : 1; }
int cudaStreamQuery(void *s) {
	FAIL("cudaStreamQuery");
	return s == &fake_stream ? 0 : 1;
}
int cudaStreamDestroy(void *s) { return s == &fake_stream ? 0 : 1; }
#ifndef FAKE_OMIT_SYMBOL
int cudaDeviceGetPCIBusId(char *buf, int len, int dev) {
	FAIL("cudaDeviceGetPCIBusId");
	snprintf(buf, len, "0000:%02X:00.0", 0x10 + dev);
	return 0;
}
#endif
#endif

#ifdef FAKE_NCCL
static int fake_comm;
const char *ncclGetErrorString(int r) {
	switch (r) {
	case 4: return "fake: invalid argument";
	case 5: return "fake: invalid usage";
	}
	return "fake: other error";
}
const char *ncclGetLastError(void *comm) { return comm == &fake_comm ? "fake detail for the comm" : "fake detail"; }
int ncclGetVersion(int *v) {
	FAIL("ncclGetVersion");
	*v = env_int("FAKE_NCCL_VERSION", 23203);
	return 0;
}
int ncclGetUniqueId(unsigned char *id) {
	FAIL("ncclGetUniqueId");
	for (int i = 0; i < 128; i++) id[i] = (unsigned char)(i * 7 + 3);
	return 0;
}
typedef struct { unsigned char b[128]; } uid;
int ncclCommInitRank(void **comm, int n, uid id, int rank) {
	// Returns ncclInvalidArgument unless the id arrived by value intact, so a test can tell
	// that the 128-byte struct crosses the call as nccl.h declares it.
	for (int i = 0; i < 128; i++)
		if (id.b[i] != (unsigned char)(i * 7 + 3)) return 4;
	FAIL("ncclCommInitRank");
	*comm = &fake_comm;
	return 0;
}
int ncclCommDestroy(void *c) { return c == &fake_comm ? 0 : 4; }
int ncclCommAbort(void *c) { return c == &fake_comm ? 0 : 4; }
int ncclCommGetAsyncError(void *c, int *e) {
	FAIL("ncclCommGetAsyncError");
	*e = env_int("FAKE_NCCL_ASYNC_ERR", 0);
	return 0;
}
// Collectives of one rank: copy send to recv when they differ.
static const size_t type_size[] = {1, 1, 4, 4, 8, 8, 2, 4, 8, 2};
static int one_rank(const void *s, void *r, size_t n, int dt) {
	if (dt < 0 || dt > 9) return 4;
	if (s != r) memmove(r, s, n * type_size[dt]);
	return 0;
}
int ncclAllReduce(const void *s, void *r, size_t n, int dt, int op, void *c, void *st) {
	FAIL(__func__);
	return op < 0 || op > 4 ? 4 : one_rank(s, r, n, dt);
}
int ncclBroadcast(const void *s, void *r, size_t n, int dt, int root, void *c, void *st) {
	FAIL(__func__);
	return one_rank(s, r, n, dt);
}
#ifndef FAKE_OMIT_SYMBOL
int ncclAllGather(const void *s, void *r, size_t n, int dt, void *c, void *st) {
	FAIL(__func__);
	return one_rank(s, r, n, dt);
}
#endif
/* The group depth is per thread, as NCCL's: ending a group on a thread that opened none is
   ncclInvalidUsage. */
static __thread int group_depth;
int ncclGroupStart(void) { FAIL(__func__); group_depth++; return 0; }
int ncclGroupEnd(void) {
	FAIL(__func__);
	if (group_depth == 0) return 5; /* ncclInvalidUsage */
	group_depth--;
	return 0;
}
#endif
