package nccl

import (
	"errors"
	"strings"
	"testing"
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
	// Every rank of an oversubscribed machine fails, not only the ones past the last GPU.
	if _, err := Place(fixedCount{n: 2}, 0, 3); !errors.As(err, &pe) {
		t.Errorf("local rank 0 of 3 on 2 GPUs: %v", err)
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
	// The fake PCI bus id matches no NVML device: the error says which step failed, whether
	// NVML is missing (CPU machines) or present.
	if err == nil || !strings.Contains(err.Error(), "describing GPU 1") {
		t.Errorf("err = %v", err)
	}
	s := DeviceInfo{Device: 3, PCIBusID: "0000:3B:00.0", Name: "NVIDIA H100", MemoryTotal: 80 << 30, MemoryFree: 79 << 30}.String()
	if s != "GPU 3 NVIDIA H100 (PCI 0000:3B:00.0, 80.0 GiB, 79.0 GiB free)" {
		t.Errorf("String = %q", s)
	}
}
