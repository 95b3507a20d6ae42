package tf

// The C library comes from the pinned TensorFlow wheel, laid out by `make setup` under
// third_party/tensorflow; the rpath lets binaries run without LD_LIBRARY_PATH.

/*
#cgo CFLAGS: -I${SRCDIR}/../third_party/tensorflow/include
#cgo LDFLAGS: -L${SRCDIR}/../third_party/tensorflow/lib -ltensorflow_cc -ltensorflow_framework -Wl,-rpath,${SRCDIR}/../third_party/tensorflow/lib
#include <stdlib.h>
#include <tensorflow/c/c_api.h>
*/
import "C"

import (
	"slices"
	"unsafe"
)

// Version is the version of the TensorFlow C library linked in, e.g. "2.21.0".
func Version() string {
	return C.GoString(C.TF_Version())
}

// The fields of tensorflow.KernelList and KernelDef (tensorflow/core/framework/kernel_def.proto).
const (
	kernelListKernel    = 1
	kernelDefDeviceType = 2
)

// KernelDeviceTypes lists the device types ("CPU", "GPU", ...) this TensorFlow has a kernel of
// op for, without creating a device: a CPU build (tensorflow-cpu) has no "GPU" kernel, whatever
// GPUs the machine has.
func KernelDeviceTypes(op string) ([]string, error) {
	cop := C.CString(op)
	defer C.free(unsafe.Pointer(cop))
	st := newStatus()
	defer st.delete()
	buf := C.TF_GetRegisteredKernelsForOp(cop, st.c)
	if err := st.err("registered kernels of " + op); err != nil {
		return nil, err
	}
	defer C.TF_DeleteBuffer(buf)
	kernels, err := fields(C.GoBytes(buf.data, C.int(buf.length)), "KernelList")
	if err != nil {
		return nil, err
	}
	var types []string
	for _, k := range kernels {
		if k.num != kernelListKernel {
			continue
		}
		def, err := fields(k.b, "KernelDef")
		if err != nil {
			return nil, err
		}
		for _, f := range def {
			if f.num == kernelDefDeviceType && !slices.Contains(types, string(f.b)) {
				types = append(types, string(f.b))
			}
		}
	}
	return types, nil
}
