package tf

/*
#include <malloc.h>
*/
import "C"

import (
	"fmt"
	"math"
)

// ReuseFreedMemory has glibc's malloc, which TensorFlow's CPU kernels allocate their tensors
// from, keep what a session run frees for the next run instead of handing it back to the
// kernel: blocks up to 32 MiB come from the heap rather than a mapping of their own (unmapped
// when freed), and a heap's free top is kept (trimming needs 2 GiB free) and grown 256 MiB at a
// time. By default a training step's temporaries of several MiB are unmapped or trimmed when
// freed and the next step faults every page in again, zeroed by the kernel: MiniLM's step
// (batch 16 x 128) took about 70,000 page faults, 0.15-0.2 s of system time per rank. The cost
// is a resident size that stays at its peak. It is process-wide and lasts; call it once,
// before the first session runs. It returns an error where the C library refuses a setting.
func ReuseFreedMemory() error {
	for _, o := range []struct {
		name  string
		param C.int
		value C.int
	}{
		{"M_MMAP_THRESHOLD", C.M_MMAP_THRESHOLD, 32 << 20}, // glibc's largest on 64 bits
		{"M_TRIM_THRESHOLD", C.M_TRIM_THRESHOLD, math.MaxInt32},
		{"M_TOP_PAD", C.M_TOP_PAD, 256 << 20},
	} {
		if C.mallopt(o.param, o.value) != 1 {
			return fmt.Errorf("tf: mallopt(%s, %d) refused", o.name, o.value)
		}
	}
	return nil
}
