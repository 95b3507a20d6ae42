package nccl

/*
#include "trampolines.h"
*/
import "C"

import (
	"fmt"
	"runtime"
	"unsafe"
)

// Library is NCCL (libnccl), loaded with Load, used with the CUDA runtime it was loaded with.
type Library struct {
	rt      *Runtime
	path    string
	version int

	getVersion, getUniqueID, getErrorString, commInitRank, commDestroy, commAbort unsafe.Pointer
	commGetAsyncError, allReduce, broadcast, allGather, groupStart, groupEnd      unsafe.Pointer
	getLastError                                                                  unsafe.Pointer // NCCL >= 2.13, else nil
}

// Load finds and loads NCCL (see Options for where it looks), to be used on devices of rt.
// It fails with a *LibraryNotFoundError listing every place looked, or a *SymbolNotFoundError.
func Load(rt *Runtime, opts Options) (*Library, error) {
	if rt == nil {
		return nil, fmt.Errorf("nccl: Load needs the CUDA runtime (LoadRuntime)")
	}
	lib, err := ncclSpec.open(searchPlaces(ncclSpec, opts.LibraryPath, opts))
	if err != nil {
		return nil, err
	}
	l := &Library{rt: rt, path: lib.path}
	if err := lib.symbols([]symbolSlot{
		{"ncclGetVersion", &l.getVersion},
		{"ncclGetUniqueId", &l.getUniqueID},
		{"ncclGetErrorString", &l.getErrorString},
		{"ncclCommInitRank", &l.commInitRank},
		{"ncclCommDestroy", &l.commDestroy},
		{"ncclCommAbort", &l.commAbort},
		{"ncclCommGetAsyncError", &l.commGetAsyncError},
		{"ncclAllReduce", &l.allReduce},
		{"ncclBroadcast", &l.broadcast},
		{"ncclAllGather", &l.allGather},
		{"ncclGroupStart", &l.groupStart},
		{"ncclGroupEnd", &l.groupEnd},
	}); err != nil {
		lib.close()
		return nil, err
	}
	l.getLastError, _ = lib.symbol("ncclGetLastError") // optional: only adds detail to errors
	var v C.int
	if err := l.check(C.gr_call_pi(l.getVersion, &v), nil, "ncclGetVersion"); err != nil {
		lib.close()
		return nil, err
	}
	l.version = int(v)
	return l, nil
}

// Path is the file that was loaded: for a soname, the one the dynamic linker found.
func (l *Library) Path() string { return l.path }

// Runtime is the CUDA runtime the library works with.
func (l *Library) Runtime() *Runtime { return l.rt }

// Version is NCCL_VERSION_CODE of the loaded library (e.g. 23203 for 2.32.3).
func (l *Library) Version() int { return l.version }

// VersionString is the version as major.minor.patch.
func (l *Library) VersionString() string {
	v := l.version
	if v < 10000 { // codes before 2.9: major*1000 + minor*100 + patch
		return fmt.Sprintf("%d.%d.%d", v/1000, v%1000/100, v%100)
	}
	return fmt.Sprintf("%d.%d.%d", v/10000, v%10000/100, v%100)
}

// check turns an ncclResult_t into an *NCCLError (nil for ncclSuccess). comm, when not nil,
// is asked for NCCL's last error message.
func (l *Library) check(code C.int, comm unsafe.Pointer, op string, args ...any) error {
	if code == C.int(Success) {
		return nil
	}
	e := &NCCLError{Op: fmt.Sprintf(op, args...), Code: Result(code),
		Message: C.GoString(C.gr_call_s_i(l.getErrorString, code))}
	if l.getLastError != nil {
		e.Detail = C.GoString(C.gr_call_s_p(l.getLastError, comm))
	}
	return e
}

// GetUniqueID makes the id that names a new communicator; one rank calls it and sends the
// result to the others.
func (l *Library) GetUniqueID() (UniqueID, error) {
	var id C.gorovod_unique_id
	if err := l.check(C.gr_call_p(l.getUniqueID, unsafe.Pointer(&id)), nil, "ncclGetUniqueId"); err != nil {
		return UniqueID{}, err
	}
	return *(*UniqueID)(unsafe.Pointer(&id)), nil
}

// GroupStart and GroupEnd bracket several collectives so NCCL launches them as one
// (ncclGroupStart/ncclGroupEnd). NCCL keeps the open group per OS thread: GroupStart locks the
// calling goroutine to its thread until GroupEnd, so the group's collectives, made from that
// goroutine, join it, and GroupEnd ends it on the thread that opened it. A goroutine free to
// move between threads would leave the group open on one (holding back every later collective
// that ran there) and call GroupEnd on another, where NCCL has no group to end.
func (l *Library) GroupStart() error {
	runtime.LockOSThread()
	if err := l.check(C.gr_call_v(l.groupStart), nil, "ncclGroupStart"); err != nil {
		runtime.UnlockOSThread()
		return err
	}
	return nil
}

// GroupEnd ends a group started with GroupStart, from the same goroutine, and unlocks its
// thread.
func (l *Library) GroupEnd() error {
	defer runtime.UnlockOSThread()
	return l.check(C.gr_call_v(l.groupEnd), nil, "ncclGroupEnd")
}
