package nccl

import (
	"fmt"
	"strconv"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
)

// DeviceCounter says how many GPUs this process sees (*Runtime does).
type DeviceCounter interface {
	DeviceCount() (int, error)
}

// Placement is the GPU one rank uses, chosen by its local rank as Horovod does.
type Placement struct {
	LocalRank int
	// Device is the CUDA device index for NCCL, streams and buffers.
	Device int
	// VisibleDeviceList is TensorFlow's GPUOptions.visible_device_list, so that the rank's
	// TensorFlow session sees only that GPU (as its /GPU:0).
	VisibleDeviceList string
}

// PlacementError reports more ranks on a machine than GPUs.
type PlacementError struct {
	LocalRank, LocalSize, Devices int
}

func (e *PlacementError) Error() string {
	// Every rank of the machine fails, those with a GPU too: name the ones without.
	without := fmt.Sprintf("local rank %d has none", e.Devices)
	if e.LocalSize-e.Devices > 1 {
		without = fmt.Sprintf("local ranks %d to %d have none", e.Devices, e.LocalSize-1)
	}
	return fmt.Sprintf("nccl: %d ranks on this machine but only %d GPU(s) visible (%s): "+
		"start at most %d rank(s) per machine (mpirun -npernode %d) or make more GPUs visible (CUDA_VISIBLE_DEVICES)",
		e.LocalSize, e.Devices, without, e.Devices, e.Devices)
}

// Place pins the rank with localRank of localSize to GPU localRank. It fails with a
// *PlacementError when the machine has fewer GPUs than ranks, and passes through the
// counter's error (a *NoDeviceError when there is no GPU at all).
func Place(c DeviceCounter, localRank, localSize int) (Placement, error) {
	if localSize < 1 || localRank < 0 || localRank >= localSize {
		return Placement{}, fmt.Errorf("nccl: Place: local rank %d of local size %d, want 0 <= local rank < local size", localRank, localSize)
	}
	n, err := c.DeviceCount()
	if err != nil {
		return Placement{}, err
	}
	if localSize > n {
		return Placement{}, &PlacementError{LocalRank: localRank, LocalSize: localSize, Devices: n}
	}
	return Placement{LocalRank: localRank, Device: localRank, VisibleDeviceList: strconv.Itoa(localRank)}, nil
}

// DeviceInfo describes one GPU for the logs.
type DeviceInfo struct {
	Device      int
	PCIBusID    string
	Name        string
	MemoryTotal uint64
	MemoryFree  uint64
}

func (d DeviceInfo) String() string {
	return fmt.Sprintf("GPU %d %s (PCI %s, %.1f GiB, %.1f GiB free)", d.Device, d.Name, d.PCIBusID,
		float64(d.MemoryTotal)/(1<<30), float64(d.MemoryFree)/(1<<30))
}

// Describe reads dev's name and memory from NVML (go-nvml, which loads libnvidia-ml with
// dlopen too). The device is matched by PCI bus id, not by index: NVML numbers GPUs in PCI
// order, CUDA (by default) fastest first, and CUDA_VISIBLE_DEVICES renumbers only CUDA's.
func (rt *Runtime) Describe(dev int) (DeviceInfo, error) {
	bus, err := rt.PCIBusID(dev)
	if err != nil {
		return DeviceInfo{}, err
	}
	info := DeviceInfo{Device: dev, PCIBusID: bus}
	if r := rt.nvml.Init(); r != nvml.SUCCESS {
		return info, fmt.Errorf("nccl: describing GPU %d (PCI %s): nvml.Init: %v", dev, bus, r)
	}
	defer rt.nvml.Shutdown()
	h, r := rt.nvml.DeviceGetHandleByPciBusId(bus)
	if r != nvml.SUCCESS {
		return info, fmt.Errorf("nccl: describing GPU %d: NVML has no device at PCI %s: %v", dev, bus, r)
	}
	if info.Name, r = h.GetName(); r != nvml.SUCCESS {
		return info, fmt.Errorf("nccl: describing GPU %d (PCI %s): name: %v", dev, bus, r)
	}
	mem, r := h.GetMemoryInfo()
	if r != nvml.SUCCESS {
		return info, fmt.Errorf("nccl: describing GPU %d (PCI %s): memory: %v", dev, bus, r)
	}
	info.MemoryTotal, info.MemoryFree = mem.Total, mem.Free
	return info, nil
}
