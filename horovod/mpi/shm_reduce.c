#include "shm_reduce.h"

#include <string.h>

// The sum is formed a block at a time in a buffer of its own, small enough to stay in the
// core's first-level cache, then copied into every rank's buffer: each input is read once and
// each output written once, and the compiler vectorizes both loops (elementwise, no reordering
// of a sum: the bits are what adding the ranks' values in rank order gives).
enum { BLOCK_BYTES = 8192 };

#define SUM_BLOCKS(T, U)                                                                          \
	static void sum_##T(void *const *bufs, int k, size_t lo, size_t hi) {                         \
		T acc[BLOCK_BYTES / sizeof(T)] __attribute__((aligned(64)));                              \
		const size_t per = BLOCK_BYTES / sizeof(T);                                               \
		for (size_t start = lo; start < hi; start += per) {                                       \
			size_t n = hi - start < per ? hi - start : per;                                       \
			const T *first = (const T *)bufs[0] + start;                                          \
			for (size_t i = 0; i < n; i++) acc[i] = first[i];                                     \
			for (int p = 1; p < k; p++) {                                                         \
				const T *in = (const T *)bufs[p] + start;                                         \
				for (size_t i = 0; i < n; i++) acc[i] = (T)((U)acc[i] + (U)in[i]);                \
			}                                                                                     \
			for (int p = 0; p < k; p++) memcpy((T *)bufs[p] + start, acc, n * sizeof(T));         \
		}                                                                                         \
	}

// Integers add as their unsigned types, which wrap as MPI's sums do (a signed overflow is
// undefined in C); floats as themselves.
SUM_BLOCKS(uint8_t, uint8_t)
SUM_BLOCKS(int8_t, uint8_t)
SUM_BLOCKS(int32_t, uint32_t)
SUM_BLOCKS(int64_t, uint64_t)
SUM_BLOCKS(float, float)
SUM_BLOCKS(double, double)

int gorovod_shm_sum(void *const *bufs, int k, size_t lo, size_t hi, int dtype) {
	switch (dtype) {
	case SHM_UINT8: sum_uint8_t(bufs, k, lo, hi); return 0;
	case SHM_INT8: sum_int8_t(bufs, k, lo, hi); return 0;
	case SHM_INT32: sum_int32_t(bufs, k, lo, hi); return 0;
	case SHM_INT64: sum_int64_t(bufs, k, lo, hi); return 0;
	case SHM_FLOAT32: sum_float(bufs, k, lo, hi); return 0;
	case SHM_FLOAT64: sum_double(bufs, k, lo, hi); return 0;
	}
	return -1;
}
