package tf

// The C library comes from the pinned TensorFlow wheel, laid out by `make setup` under
// third_party/tensorflow; the rpath lets binaries run without LD_LIBRARY_PATH.

/*
#cgo CFLAGS: -I${SRCDIR}/../third_party/tensorflow/include
#cgo LDFLAGS: -L${SRCDIR}/../third_party/tensorflow/lib -ltensorflow_cc -ltensorflow_framework -Wl,-rpath,${SRCDIR}/../third_party/tensorflow/lib
#include <tensorflow/c/c_api.h>
*/
import "C"

// Version is the version of the TensorFlow C library linked in, e.g. "2.21.0".
func Version() string {
	return C.GoString(C.TF_Version())
}
