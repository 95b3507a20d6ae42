package tf

/*
#include <tensorflow/c/tf_status.h>
*/
import "C"

import "fmt"

// Code is a TensorFlow status code (the values of error_codes.proto).
type Code int

// The TensorFlow status codes.
const (
	CodeOK                 Code = 0
	CodeCancelled          Code = 1
	CodeUnknown            Code = 2
	CodeInvalidArgument    Code = 3
	CodeDeadlineExceeded   Code = 4
	CodeNotFound           Code = 5
	CodeAlreadyExists      Code = 6
	CodePermissionDenied   Code = 7
	CodeResourceExhausted  Code = 8
	CodeFailedPrecondition Code = 9
	CodeAborted            Code = 10
	CodeOutOfRange         Code = 11
	CodeUnimplemented      Code = 12
	CodeInternal           Code = 13
	CodeUnavailable        Code = 14
	CodeDataLoss           Code = 15
	CodeUnauthenticated    Code = 16
)

var codeNames = [...]string{
	"OK", "CANCELLED", "UNKNOWN", "INVALID_ARGUMENT", "DEADLINE_EXCEEDED", "NOT_FOUND",
	"ALREADY_EXISTS", "PERMISSION_DENIED", "RESOURCE_EXHAUSTED", "FAILED_PRECONDITION",
	"ABORTED", "OUT_OF_RANGE", "UNIMPLEMENTED", "INTERNAL", "UNAVAILABLE", "DATA_LOSS",
	"UNAUTHENTICATED",
}

func (c Code) String() string {
	if c >= 0 && int(c) < len(codeNames) {
		return codeNames[c]
	}
	return fmt.Sprintf("CODE_%d", int(c))
}

// Error is a failed TF_Status: TensorFlow's code and message, plus what we were doing when it
// failed (which op, signature or file). Use errors.As to inspect the code.
type Error struct {
	Op      string // our context, e.g. `load SavedModel "/m" tags [serve]`
	Code    Code
	Message string
}

func (e *Error) Error() string {
	return fmt.Sprintf("%s: %s: %s", e.Op, e.Code, e.Message)
}

// status wraps a TF_Status for one C call.
type status struct{ c *C.TF_Status }

func newStatus() status { return status{C.TF_NewStatus()} }

func (s status) delete() { C.TF_DeleteStatus(s.c) }

func (s status) ok() bool { return C.TF_GetCode(s.c) == C.TF_OK }

// err returns nil when the status is OK and an *Error naming op otherwise.
func (s status) err(op string) error {
	code := C.TF_GetCode(s.c)
	if code == C.TF_OK {
		return nil
	}
	return &Error{Op: op, Code: Code(code), Message: C.GoString(C.TF_Message(s.c))}
}
