package nccl

import (
	"errors"
	"strings"
	"testing"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock"
)

type fixedCount struct {
	n   int
	err error
}

func (f fixedCount) DeviceCount() (int, error) { return f.n, f.err }

func TestPlace(t *testing.T) {
	for lr := 0; lr < 4; lr++ {
		p, err := Place(fixedCount{n: 4}, lr, 4)
		if err != nil {
			t.Fatal(err)
		}
		want := Placement{LocalRank: lr, Device: lr, VisibleDeviceList: string(rune('0' + lr))}
		if p != want {
			t.Errorf("Place(%d of 4) = %+v, want %+v", lr, p, want)
		}
	}
	_, err := Place(fixedCount{n: 2}, 1, 8)
	var pe *PlacementError
	if !errors.As(err, &pe) || pe.LocalSize != 8 || pe.Devices != 2 || pe.LocalRank != 1 {
		t.Fatalf("8 ranks on 2 GPUs: %v", err)
	}
	if !strings.Contains(err.Error(), "8 ranks on this machine but only 2 GPU(s) visible") {
		t.Errorf("message %q", err)
	}
	// Every rank of an oversubscribed machine fails, not only the ones past the last GPU, and
	// says which local ranks have no GPU: not itself, when it has one.
	for lr := range 3 {
		if _, err := Place(fixedCount{n: 2}, lr, 3); !errors.As(err, &pe) || !strings.Contains(err.Error(), "(local rank 2 has none)") {
			t.Errorf("local rank %d of 3 on 2 GPUs: %v", lr, err)
		}
	}
	if _, err := Place(fixedCount{n: 1}, 0, 4); err == nil || !strings.Contains(err.Error(), "(local ranks 1 to 3 have none)") {
		t.Errorf("local rank 0 of 4 on 1 GPU: %v", err)
	}
	noGPU := &NoDeviceError{}
	if _, err := Place(fixedCount{err: noGPU}, 0, 1); !errors.Is(err, noGPU) {
		t.Errorf("counter error not passed through: %v", err)
	}
	for _, bad := range [][2]int{{0, 0}, {2, 2}, {-1, 1}} {
		if _, err := Place(fixedCount{n: 8}, bad[0], bad[1]); err == nil || !strings.Contains(err.Error(), "want 0 <= local rank < local size") {
			t.Errorf("Place(%d of %d) = %v", bad[0], bad[1], err)
		}
	}
	// The runtime is a DeviceCounter.
	if p, err := Place(fakeRuntime(t, "2"), 1, 2); err != nil || p.Device != 1 {
		t.Errorf("Place with the runtime: %+v, %v", p, err)
	}
}

func TestDescribe(t *testing.T) {
	rt := fakeRuntime(t, "2")
	var de *DeviceIndexError
	if _, err := rt.Describe(2); !errors.As(err, &de) {
		t.Errorf("Describe(2) = %v", err)
	}
	info, err := rt.Describe(1)
	if info.PCIBusID != "0000:11:00.0" || info.Device != 1 {
		t.Errorf("info = %+v", info)
	}
	// The real NVML: missing on CPU machines, and it knows no device at the fake's PCI bus id
	// where it is present. Either way the error names the GPU and the bus id is kept.
	if err == nil || !strings.Contains(err.Error(), "describing GPU 1") {
		t.Errorf("err = %v", err)
	}
	// The NVML side, through go-nvml's own mock: the device is looked up by the PCI bus id CUDA
	// gave, and each NVML failure names its step.
	dev := &mock.Device{
		GetNameFunc:       func() (string, nvml.Return) { return "NVIDIA H200", nvml.SUCCESS },
		GetMemoryInfoFunc: func() (nvml.Memory, nvml.Return) { return nvml.Memory{Total: 141 << 30, Free: 140 << 30}, nvml.SUCCESS },
	}
	var asked string
	lib := &mock.Interface{
		InitFunc:     func() nvml.Return { return nvml.SUCCESS },
		ShutdownFunc: func() nvml.Return { return nvml.SUCCESS },
		DeviceGetHandleByPciBusIdFunc: func(bus string) (nvml.Device, nvml.Return) {
			asked = bus
			return dev, nvml.SUCCESS
		},
	}
	rt.nvml = lib
	info, err = rt.Describe(1)
	want := DeviceInfo{Device: 1, PCIBusID: "0000:11:00.0", Name: "NVIDIA H200", MemoryTotal: 141 << 30, MemoryFree: 140 << 30}
	if err != nil || info != want || asked != "0000:11:00.0" || len(lib.ShutdownCalls()) != 1 {
		t.Errorf("Describe = %+v, %v (asked NVML for %q)", info, err, asked)
	}
	dev.GetMemoryInfoFunc = func() (nvml.Memory, nvml.Return) { return nvml.Memory{}, nvml.ERROR_GPU_IS_LOST }
	if _, err := rt.Describe(1); err == nil || !strings.Contains(err.Error(), "memory: ") {
		t.Errorf("memory failure: %v", err)
	}
	dev.GetNameFunc = func() (string, nvml.Return) { return "", nvml.ERROR_UNKNOWN }
	if _, err := rt.Describe(1); err == nil || !strings.Contains(err.Error(), "name: ") {
		t.Errorf("name failure: %v", err)
	}
	lib.DeviceGetHandleByPciBusIdFunc = func(string) (nvml.Device, nvml.Return) { return nil, nvml.ERROR_NOT_FOUND }
	if _, err := rt.Describe(0); err == nil || !strings.Contains(err.Error(), "NVML has no device at PCI 0000:10:00.0") {
		t.Errorf("lookup failure: %v", err)
	}

	s := DeviceInfo{Device: 3, PCIBusID: "0000:3B:00.0", Name: "NVIDIA H100", MemoryTotal: 80 << 30, MemoryFree: 79 << 30}.String()
	if s != "GPU 3 NVIDIA H100 (PCI 0000:3B:00.0, 80.0 GiB, 79.0 GiB free)" {
		t.Errorf("String = %q", s)
	}
}
