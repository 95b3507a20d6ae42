package main

import (
	"errors"
	"slices"

	"github.com/gorovod/gorovod/nccl"
	"github.com/gorovod/gorovod/tf"
)

// tensorFlowHasGPU says whether this TensorFlow can compute on a GPU at all (MatMul's kernels
// stand for the others'). A CPU build (tensorflow-cpu, what make setup installs) computes on the
// CPU whatever GPUs and CUDA runtime the machine has: its ranks are not placed on GPUs, which
// would stop more ranks than GPUs for nothing, and --amp chooses as on a CPU.
func tensorFlowHasGPU() (bool, error) {
	types, err := tf.KernelDeviceTypes("MatMul")
	return slices.Contains(types, "GPU"), err
}

// placeGPU pins this rank to the GPU of its local rank whatever the allreduce backend: with
// --allreduce_backend=mpi, or auto at one rank, TensorFlow still computes on the GPU, and a
// machine with more ranks than GPUs would otherwise put two ranks' sessions on one device (or
// none) without a word. It returns TensorFlow's visible_device_list for the rank, "" for a CPU
// run (no CUDA runtime, or a runtime that sees no GPU), and logs the GPU through logf. More
// ranks on the machine than GPUs is a *nccl.PlacementError.
func placeGPU(libs nccl.Options, localRank, localSize int, logf func(format string, args ...any)) (string, error) {
	rt, err := nccl.LoadRuntime(libs)
	var notFound *nccl.LibraryNotFoundError
	if errors.As(err, &notFound) {
		return "", nil
	}
	if err != nil {
		return "", err
	}
	place, err := nccl.Place(rt, localRank, localSize)
	var noDevice *nccl.NoDeviceError
	if errors.As(err, &noDevice) {
		return "", nil
	}
	if err != nil {
		return "", err
	}
	info, err := rt.Describe(place.Device)
	if err != nil { // NVML is for the log only: say what is known and go on
		logf("local rank %d: GPU %d, PCI %s (%v)", localRank, place.Device, info.PCIBusID, err)
	} else {
		logf("local rank %d: %v", localRank, info)
	}
	return place.VisibleDeviceList, nil
}
