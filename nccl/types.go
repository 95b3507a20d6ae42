package nccl

import "fmt"

// The values below are ABI, declared here so that no NCCL or CUDA header is needed.
// NCCL: src/nccl.h.in of github.com/NVIDIA/nccl (ncclResult_t, ncclRedOp_t, ncclDataType_t,
// NCCL_UNIQUE_ID_BYTES); the values have been stable since NCCL 2.0, with ncclAvg added in
// 2.10 and ncclBfloat16 in 2.10. CUDA: the CUDA runtime API reference (cudaError_t,
// cudaMemcpyKind, cudaHostAlloc flags, cudaStreamCreateWithFlags flags).

// UniqueIDBytes is NCCL_UNIQUE_ID_BYTES.
const UniqueIDBytes = 128

// UniqueID is an ncclUniqueId: made by one rank (GetUniqueID), sent to all others out of band
// (gorovod sends it over MPI), and passed by every rank to NewComm.
type UniqueID [UniqueIDBytes]byte

// Result is ncclResult_t.
type Result int

// The values of ncclResult_t (nccl.h), which an *NCCLError carries.
const (
	Success            Result = 0
	UnhandledCudaError Result = 1
	SystemError        Result = 2
	InternalError      Result = 3
	InvalidArgument    Result = 4
	InvalidUsage       Result = 5
	RemoteError        Result = 6
	InProgress         Result = 7
	Timeout            Result = 8
)

var resultNames = [...]string{"ncclSuccess", "ncclUnhandledCudaError", "ncclSystemError",
	"ncclInternalError", "ncclInvalidArgument", "ncclInvalidUsage", "ncclRemoteError",
	"ncclInProgress", "ncclTimeout"}

func (r Result) String() string {
	if r >= 0 && int(r) < len(resultNames) {
		return resultNames[r]
	}
	return fmt.Sprintf("ncclResult(%d)", int(r))
}

// RedOp is ncclRedOp_t.
type RedOp int

// The reductions of ncclRedOp_t (nccl.h).
const (
	Sum  RedOp = 0
	Prod RedOp = 1
	Max  RedOp = 2
	Min  RedOp = 3
	Avg  RedOp = 4 // NCCL >= 2.10
)

var redOpNames = [...]string{"sum", "prod", "max", "min", "avg"}

func (o RedOp) String() string {
	if o >= 0 && int(o) < len(redOpNames) {
		return redOpNames[o]
	}
	return fmt.Sprintf("RedOp(%d)", int(o))
}

// minVersion210 is the first NCCL_VERSION_CODE with ncclAvg and ncclBfloat16 (2.10.0; codes
// from 2.9 on are major*10000 + minor*100 + patch).
const minVersion210 = 21000

// DataType is ncclDataType_t.
type DataType int

// The element types of ncclDataType_t (nccl.h).
const (
	Int8     DataType = 0
	Uint8    DataType = 1
	Int32    DataType = 2
	Uint32   DataType = 3
	Int64    DataType = 4
	Uint64   DataType = 5
	Float16  DataType = 6 // ncclHalf
	Float32  DataType = 7
	Float64  DataType = 8
	Bfloat16 DataType = 9 // NCCL >= 2.10
)

var dataTypes = [...]struct {
	name string
	size int
}{{"int8", 1}, {"uint8", 1}, {"int32", 4}, {"uint32", 4}, {"int64", 8}, {"uint64", 8},
	{"float16", 2}, {"float32", 4}, {"float64", 8}, {"bfloat16", 2}}

func (t DataType) valid() bool { return t >= 0 && int(t) < len(dataTypes) }

// Size is the size of one element in bytes, 0 for an unknown type.
func (t DataType) Size() int {
	if !t.valid() {
		return 0
	}
	return dataTypes[t].size
}

func (t DataType) String() string {
	if !t.valid() {
		return fmt.Sprintf("DataType(%d)", int(t))
	}
	return dataTypes[t].name
}

// CUDA runtime values.
const (
	cudaSuccess                 = 0
	cudaErrorInsufficientDriver = 35
	cudaErrorNoDevice           = 100
	cudaErrorNotReady           = 600 // cudaStreamQuery: work still pending, not a failure

	cudaMemcpyHostToDevice = 1
	cudaMemcpyDeviceToHost = 2

	// cudaHostAllocPortable: the pinned buffer counts as pinned for every CUDA context, not
	// only the one current when it was allocated.
	cudaHostAllocPortable = 0x01
	// cudaStreamNonBlocking: no implicit synchronisation with the legacy default stream
	// (which TensorFlow's own work may use).
	cudaStreamNonBlocking = 0x01
)
