package nccl

import (
	"fmt"
	"strings"
)

// Attempt is one place a library was looked for, and why it was not used.
type Attempt struct {
	// Source says why this place was tried: "option", "GOROVOD_NCCL_LIBRARY",
	// "soname", "pip wheel (site-packages of the loaded TensorFlow)", ...
	Source string
	Path   string
	Err    string
}

// LibraryNotFoundError reports a library (NCCL or the CUDA runtime) that could not be loaded,
// with every place looked, in the order tried.
type LibraryNotFoundError struct {
	Library string // "NCCL" or "CUDA runtime"
	Tried   []Attempt
}

func (e *LibraryNotFoundError) Error() string {
	var b strings.Builder
	fmt.Fprintf(&b, "nccl: %s library not found; looked in %d place(s):", e.Library, len(e.Tried))
	for _, a := range e.Tried {
		fmt.Fprintf(&b, "\n  %s: %s: %s", a.Source, a.Path, a.Err)
	}
	return b.String()
}

// SymbolNotFoundError reports a library that loaded but lacks a function the binding needs
// (usually a version too old).
type SymbolNotFoundError struct {
	Library string
	Symbol  string
}

func (e *SymbolNotFoundError) Error() string {
	return fmt.Sprintf("nccl: %s has no symbol %s (library too old or not the expected one)", e.Library, e.Symbol)
}

// CUDAError is a failed CUDA runtime call.
type CUDAError struct {
	Op      string // the call and its arguments, e.g. "cudaMalloc(1048576 bytes) on device 0"
	Code    int    // cudaError_t
	Name    string // cudaGetErrorName, e.g. "cudaErrorMemoryAllocation"
	Message string // cudaGetErrorString
}

func (e *CUDAError) Error() string {
	return fmt.Sprintf("nccl: %s: %s (%d): %s", e.Op, e.Name, e.Code, e.Message)
}

// NCCLError is a failed NCCL call.
type NCCLError struct {
	Op      string
	Code    Result
	Message string // ncclGetErrorString
	Detail  string // ncclGetLastError, when the library has it and says more
}

func (e *NCCLError) Error() string {
	s := fmt.Sprintf("nccl: %s: %s (%d): %s", e.Op, e.Code, int(e.Code), e.Message)
	if e.Detail != "" {
		s += ": " + e.Detail
	}
	return s
}

// NoDeviceError reports a machine where the CUDA runtime loaded but no GPU can be used: no
// device, no driver, or a driver older than the runtime.
type NoDeviceError struct {
	Cause error // the CUDA error from cudaGetDeviceCount, or nil when it counted zero devices
}

func (e *NoDeviceError) Error() string {
	if e.Cause == nil {
		return "nccl: no CUDA device: cudaGetDeviceCount found 0 devices"
	}
	return "nccl: no usable CUDA device: " + e.Cause.Error()
}

func (e *NoDeviceError) Unwrap() error { return e.Cause }

// DeviceIndexError reports a device index outside [0, Count).
type DeviceIndexError struct {
	Device int
	Count  int
}

func (e *DeviceIndexError) Error() string {
	return fmt.Sprintf("nccl: CUDA device %d does not exist: this process sees %d device(s) (0..%d; CUDA_VISIBLE_DEVICES narrows the list)",
		e.Device, e.Count, e.Count-1)
}
