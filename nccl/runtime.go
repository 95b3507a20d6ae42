package nccl

/*
#include <stdlib.h>
#include "trampolines.h"
*/
import "C"

import (
	"fmt"
	"runtime"
	"sync"
	"unsafe"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
)

// Runtime is the CUDA runtime (libcudart), loaded with LoadRuntime. Its methods are safe for
// concurrent use.
type Runtime struct {
	path string

	getDeviceCount, setDevice, runtimeGetVersion, driverGetVersion unsafe.Pointer
	getErrorName, getErrorString                                   unsafe.Pointer
	malloc, free, hostAlloc, freeHost, memGetInfo                  unsafe.Pointer
	memcpyAsync, streamCreateWithFlags, streamSynchronize          unsafe.Pointer
	streamQuery, streamDestroy, deviceGetPCIBusID                  unsafe.Pointer

	nvml nvml.Interface // for Describe; loads libnvidia-ml with dlopen when first used

	countOnce sync.Once
	count     int
	countErr  error
}

// LoadRuntime finds and loads the CUDA runtime (see Options for where it looks). It fails
// with a *LibraryNotFoundError listing every place looked, or a *SymbolNotFoundError.
// It does not need a GPU; DeviceCount says whether there is one.
func LoadRuntime(opts Options) (*Runtime, error) {
	lib, err := runtimeSpec.open(searchPlaces(runtimeSpec, opts.RuntimePath, opts))
	if err != nil {
		return nil, err
	}
	rt := &Runtime{path: lib.path, nvml: nvml.New()}
	if err := lib.symbols([]symbolSlot{
		{"cudaGetDeviceCount", &rt.getDeviceCount},
		{"cudaSetDevice", &rt.setDevice},
		{"cudaRuntimeGetVersion", &rt.runtimeGetVersion},
		{"cudaDriverGetVersion", &rt.driverGetVersion},
		{"cudaGetErrorName", &rt.getErrorName},
		{"cudaGetErrorString", &rt.getErrorString},
		{"cudaMalloc", &rt.malloc},
		{"cudaFree", &rt.free},
		{"cudaHostAlloc", &rt.hostAlloc},
		{"cudaFreeHost", &rt.freeHost},
		{"cudaMemGetInfo", &rt.memGetInfo},
		{"cudaMemcpyAsync", &rt.memcpyAsync},
		{"cudaStreamCreateWithFlags", &rt.streamCreateWithFlags},
		{"cudaStreamSynchronize", &rt.streamSynchronize},
		{"cudaStreamQuery", &rt.streamQuery},
		{"cudaStreamDestroy", &rt.streamDestroy},
		{"cudaDeviceGetPCIBusId", &rt.deviceGetPCIBusID},
	}); err != nil {
		lib.close()
		return nil, err
	}
	return rt, nil
}

// Path is the file that was loaded: for a soname, the one the dynamic linker found.
func (rt *Runtime) Path() string { return rt.path }

// check turns a cudaError_t into a *CUDAError (nil for cudaSuccess).
func (rt *Runtime) check(code C.int, op string, args ...any) error {
	if code == cudaSuccess {
		return nil
	}
	return &CUDAError{
		Op:      fmt.Sprintf(op, args...),
		Code:    int(code),
		Name:    C.GoString(C.gr_call_s_i(rt.getErrorName, code)),
		Message: C.GoString(C.gr_call_s_i(rt.getErrorString, code)),
	}
}

// Version is cudaRuntimeGetVersion: 1000*major + 10*minor (12090 for CUDA 12.9).
func (rt *Runtime) Version() (int, error) {
	var v C.int
	return int(v), rt.check(C.gr_call_pi(rt.runtimeGetVersion, &v), "cudaRuntimeGetVersion")
}

// DriverVersion is cudaDriverGetVersion: the CUDA version the installed driver supports,
// 0 when no driver is installed.
func (rt *Runtime) DriverVersion() (int, error) {
	var v C.int
	return int(v), rt.check(C.gr_call_pi(rt.driverGetVersion, &v), "cudaDriverGetVersion")
}

// DeviceCount is the number of CUDA devices this process sees. No device, no driver or a
// driver older than the runtime is a *NoDeviceError. The answer is asked once and kept: CUDA
// fixes the device list when it initialises.
func (rt *Runtime) DeviceCount() (int, error) {
	rt.countOnce.Do(func() {
		var n C.int
		code := C.gr_call_pi(rt.getDeviceCount, &n)
		switch {
		case code == cudaErrorNoDevice || code == cudaErrorInsufficientDriver:
			rt.countErr = &NoDeviceError{Cause: rt.check(code, "cudaGetDeviceCount")}
		case code != cudaSuccess:
			rt.countErr = rt.check(code, "cudaGetDeviceCount")
		case n == 0:
			rt.countErr = &NoDeviceError{}
		default:
			rt.count = int(n)
		}
	})
	return rt.count, rt.countErr
}

// CheckDevice returns a *DeviceIndexError unless dev is one of this process's devices.
func (rt *Runtime) CheckDevice(dev int) error {
	n, err := rt.DeviceCount()
	if err != nil {
		return err
	}
	if dev < 0 || dev >= n {
		return &DeviceIndexError{Device: dev, Count: n}
	}
	return nil
}

// onDevice runs f on one OS thread whose current CUDA device is dev. Every call that creates
// or uses device state goes through it: making a call with the wrong current device would,
// at best, create a second context on device 0 in every rank.
func (rt *Runtime) onDevice(dev int, f func() error) error {
	if err := rt.CheckDevice(dev); err != nil {
		return err
	}
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	if err := rt.check(C.gr_call_i(rt.setDevice, C.int(dev)), "cudaSetDevice(%d)", dev); err != nil {
		return err
	}
	return f()
}

// PCIBusID is the device's PCI bus id, "domain:bus:device.function" as nvidia-smi prints it.
func (rt *Runtime) PCIBusID(dev int) (string, error) {
	if err := rt.CheckDevice(dev); err != nil {
		return "", err
	}
	var buf [32]C.char // "0000:00:00.0" and a NUL need 13
	if err := rt.check(C.gr_call_s_i_i(rt.deviceGetPCIBusID, &buf[0], C.int(len(buf)), C.int(dev)),
		"cudaDeviceGetPCIBusId(%d)", dev); err != nil {
		return "", err
	}
	return C.GoString(&buf[0]), nil
}

// MemInfo is cudaMemGetInfo on dev: free and total bytes.
func (rt *Runtime) MemInfo(dev int) (free, total uint64, err error) {
	err = rt.onDevice(dev, func() error {
		var f, t C.size_t
		if err := rt.check(C.gr_call_pz_pz(rt.memGetInfo, &f, &t), "cudaMemGetInfo on device %d", dev); err != nil {
			return err
		}
		free, total = uint64(f), uint64(t)
		return nil
	})
	return free, total, err
}
