package nccl

import (
	"bytes"
	"errors"
	"strings"
	"testing"
)

func TestNoDevice(t *testing.T) {
	for _, tc := range []struct {
		code, name string
	}{{"100", "cudaErrorNoDevice"}, {"35", "cudaErrorInsufficientDriver"}} {
		t.Setenv("FAKE_FAIL", "cudaGetDeviceCount:"+tc.code)
		rt := fakeRuntime(t, "4")
		_, err := rt.DeviceCount()
		var nd *NoDeviceError
		var ce *CUDAError
		if !errors.As(err, &nd) || !errors.As(err, &ce) || ce.Name != tc.name || ce.Op != "cudaGetDeviceCount" {
			t.Fatalf("code %s: err = %v, want *NoDeviceError wrapping %s", tc.code, err, tc.name)
		}
		if !strings.Contains(err.Error(), "no usable CUDA device: nccl: cudaGetDeviceCount: "+tc.name) {
			t.Errorf("message %q", err)
		}
		// Every device operation reports the same typed error.
		if _, err := rt.AllocDevice(0, 16); !errors.As(err, &nd) {
			t.Errorf("AllocDevice without a device: %v", err)
		}
	}
	t.Setenv("FAKE_FAIL", "")
	_, err := fakeRuntime(t, "0").DeviceCount()
	var nd *NoDeviceError
	if !errors.As(err, &nd) || nd.Cause != nil || !strings.Contains(err.Error(), "0 devices") {
		t.Fatalf("zero devices: err = %v", err)
	}
	// Any other failure is a plain CUDA error, not "no device".
	t.Setenv("FAKE_FAIL", "cudaGetDeviceCount:1")
	_, err = fakeRuntime(t, "2").DeviceCount()
	var ce *CUDAError
	if !errors.As(err, &ce) || errors.As(err, &nd) || ce.Code != 1 {
		t.Fatalf("invalid value: err = %v", err)
	}
}

func TestWrongDeviceIndex(t *testing.T) {
	rt := fakeRuntime(t, "2")
	if n, err := rt.DeviceCount(); n != 2 || err != nil {
		t.Fatalf("DeviceCount = %d, %v", n, err)
	}
	for _, dev := range []int{-1, 2, 7} {
		var de *DeviceIndexError
		err := rt.CheckDevice(dev)
		if !errors.As(err, &de) || de.Device != dev || de.Count != 2 {
			t.Errorf("CheckDevice(%d) = %v", dev, err)
		}
		if _, err := rt.AllocDevice(dev, 8); !errors.As(err, &de) {
			t.Errorf("AllocDevice(%d) = %v", dev, err)
		}
		if _, err := rt.AllocPinned(dev, 8); !errors.As(err, &de) {
			t.Errorf("AllocPinned(%d) = %v", dev, err)
		}
		if _, err := rt.NewStream(dev); !errors.As(err, &de) {
			t.Errorf("NewStream(%d) = %v", dev, err)
		}
		if _, err := rt.PCIBusID(dev); !errors.As(err, &de) {
			t.Errorf("PCIBusID(%d) = %v", dev, err)
		}
		if _, _, err := rt.MemInfo(dev); !errors.As(err, &de) {
			t.Errorf("MemInfo(%d) = %v", dev, err)
		}
	}
	if msg := rt.CheckDevice(2).Error(); !strings.Contains(msg, "device 2 does not exist") || !strings.Contains(msg, "sees 2 device(s)") {
		t.Errorf("message: %s", msg)
	}
	if err := rt.CheckDevice(1); err != nil {
		t.Errorf("CheckDevice(1) = %v", err)
	}
}

func TestRuntimeQueries(t *testing.T) {
	rt := fakeRuntime(t, "2")
	if v, err := rt.Version(); v != 12090 || err != nil {
		t.Errorf("Version = %d, %v", v, err)
	}
	if v, err := rt.DriverVersion(); v != 0 || err != nil {
		t.Errorf("DriverVersion = %d, %v", v, err)
	}
	if id, err := rt.PCIBusID(1); id != "0000:11:00.0" || err != nil {
		t.Errorf("PCIBusID(1) = %q, %v", id, err)
	}
	if f, tot, err := rt.MemInfo(1); f != 1<<20 || tot != 2<<20 || err != nil {
		t.Errorf("MemInfo = %d, %d, %v", f, tot, err)
	}
	// Each call's failure is a *CUDAError naming that call.
	var ce *CUDAError
	t.Setenv("FAKE_FAIL", "cudaDeviceGetPCIBusId:101,cudaMemGetInfo:3")
	if _, err := rt.PCIBusID(0); !errors.As(err, &ce) || ce.Op != "cudaDeviceGetPCIBusId(0)" {
		t.Errorf("PCIBusID: %v", err)
	}
	if _, _, err := rt.MemInfo(0); !errors.As(err, &ce) || ce.Op != "cudaMemGetInfo on device 0" {
		t.Errorf("MemInfo: %v", err)
	}
	// Selecting the device is checked too (a device that vanished, a busy exclusive GPU).
	t.Setenv("FAKE_FAIL", "cudaSetDevice:101")
	if _, err := rt.AllocDevice(1, 8); !errors.As(err, &ce) || ce.Op != "cudaSetDevice(1)" || ce.Name != "cudaErrorInvalidDevice" {
		t.Errorf("AllocDevice with failing cudaSetDevice: %v", err)
	}
}

func TestCUDAErrorCarriesOpAndNames(t *testing.T) {
	rt := fakeRuntime(t, "1")
	t.Setenv("FAKE_FAIL", "cudaMalloc:2,cudaHostAlloc:2")
	_, err := rt.AllocDevice(0, 1024)
	var ce *CUDAError
	if !errors.As(err, &ce) || ce.Code != 2 || ce.Name != "cudaErrorMemoryAllocation" ||
		ce.Message != "fake message for cudaErrorMemoryAllocation" || ce.Op != "cudaMalloc(1024 bytes) on device 0" {
		t.Fatalf("err = %#v", err)
	}
	if want := "nccl: cudaMalloc(1024 bytes) on device 0: cudaErrorMemoryAllocation (2): fake message for cudaErrorMemoryAllocation"; err.Error() != want {
		t.Errorf("message %q, want %q", err.Error(), want)
	}
	if _, err := rt.AllocPinned(0, 64); !errors.As(err, &ce) || !strings.Contains(ce.Op, "cudaHostAlloc(64 bytes, portable)") {
		t.Errorf("AllocPinned: %v", err)
	}
	for _, size := range []int{0, -5} {
		if _, err := rt.AllocDevice(0, size); err == nil || !strings.Contains(err.Error(), "want > 0") {
			t.Errorf("AllocDevice(size %d) = %v", size, err)
		}
		if _, err := rt.AllocPinned(0, size); err == nil || !strings.Contains(err.Error(), "want > 0") {
			t.Errorf("AllocPinned(size %d) = %v", size, err)
		}
	}
}

// TestStagingPlumbing checks the offsets, bounds and lifetimes of the host<->device staging
// copies; with the fake runtime "device" memory is host memory, so the bytes can be compared.
func TestStagingPlumbing(t *testing.T) {
	rt := fakeRuntime(t, "2")
	pinned, err := rt.AllocPinned(0, 64)
	if err != nil {
		t.Fatal(err)
	}
	dev, err := rt.AllocDevice(0, 32)
	if err != nil {
		t.Fatal(err)
	}
	other, err := rt.AllocDevice(1, 32)
	if err != nil {
		t.Fatal(err)
	}
	s, err := rt.NewStream(0)
	if err != nil {
		t.Fatal(err)
	}
	if pinned.Size() != 64 || dev.Size() != 32 || dev.Device() != 0 || s.Device() != 0 {
		t.Fatal("sizes or devices wrong")
	}
	host := pinned.Bytes()
	for i := range host {
		host[i] = byte(i)
	}
	// host[8:24] -> device[4:20] -> host[40:56]
	if err := s.CopyToDevice(dev, 4, pinned, 8, 16); err != nil {
		t.Fatal(err)
	}
	if err := s.CopyToHost(pinned, 40, dev, 4, 16); err != nil {
		t.Fatal(err)
	}
	if err := s.Synchronize(); err != nil {
		t.Fatal(err)
	}
	if done, err := s.Done(); !done || err != nil {
		t.Errorf("Done = %v, %v after Synchronize", done, err)
	}
	t.Setenv("FAKE_FAIL", "cudaStreamQuery:600")
	if done, err := s.Done(); done || err != nil {
		t.Errorf("Done = %v, %v while cudaErrorNotReady", done, err)
	}
	t.Setenv("FAKE_FAIL", "cudaStreamQuery:1")
	var ce *CUDAError
	if done, err := s.Done(); done || !errors.As(err, &ce) || ce.Op != "cudaStreamQuery on device 0" {
		t.Errorf("Done = %v, %v with a failing query", done, err)
	}
	t.Setenv("FAKE_FAIL", "")
	if !bytes.Equal(host[40:56], host[8:24]) {
		t.Fatalf("round trip: got %v, want %v", host[40:56], host[8:24])
	}
	for _, tc := range []struct {
		name string
		err  error
		want string
	}{
		{"device overflow", s.CopyToDevice(dev, 20, pinned, 0, 16), "CopyToDevice device side: 16 bytes at offset 20 do not fit in 32 bytes"},
		{"host overflow", s.CopyToHost(pinned, 60, dev, 0, 8), "CopyToHost host side: 8 bytes at offset 60 do not fit in 64 bytes"},
		{"negative offset", s.CopyToDevice(dev, -1, pinned, 0, 1), "offset -1"},
		{"negative count", s.CopyToHost(pinned, 0, dev, 0, -1), "-1 bytes"},
		{"wrong device", s.CopyToDevice(other, 0, pinned, 0, 8), "device buffer is on device 1, stream on device 0"},
	} {
		if tc.err == nil || !strings.Contains(tc.err.Error(), tc.want) {
			t.Errorf("%s: err = %v, want %q", tc.name, tc.err, tc.want)
		}
	}
	for _, c := range []interface{ Close() error }{other, dev, dev, pinned, pinned} {
		if err := c.Close(); err != nil {
			t.Fatal(err)
		}
	}
	if pinned.Bytes() != nil {
		t.Error("Bytes after Close is not nil")
	}
	if err := s.CopyToDevice(dev, 0, pinned, 0, 1); err == nil || !strings.Contains(err.Error(), "closed") {
		t.Errorf("copy with closed buffers: %v", err)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Done(); err == nil || !strings.Contains(err.Error(), "closed stream") {
		t.Errorf("Done on closed stream: %v", err)
	}
	if err := s.Synchronize(); err == nil || !strings.Contains(err.Error(), "closed stream") {
		t.Errorf("Synchronize on closed stream: %v", err)
	}
	if err := s.CopyToHost(pinned, 0, dev, 0, 1); err == nil || !strings.Contains(err.Error(), "closed stream") {
		t.Errorf("copy on closed stream: %v", err)
	}
}
