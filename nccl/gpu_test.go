package nccl

import (
	"bytes"
	"encoding/binary"
	"errors"
	"math"
	"math/rand/v2"
	"os"
	"sync"
	"testing"

	"github.com/x448/float16"
)

// The tests and benchmarks in this file use the real CUDA runtime and NCCL on a real GPU.
// Where there is none they skip, naming the typed error that says why, unless
// GOROVOD_REQUIRE_GPU is set (scripts/gpu-check.sh sets it): then a missing GPU fails them.

func realLibrary(tb testing.TB) *Library {
	tb.Helper()
	noGPU := tb.Skipf
	if os.Getenv("GOROVOD_REQUIRE_GPU") != "" {
		noGPU = tb.Fatalf
	}
	rt, err := LoadRuntime(Options{})
	if err != nil {
		noGPU("no GPU test: %v", err)
		return nil
	}
	if _, err := rt.DeviceCount(); err != nil {
		noGPU("no GPU test: %v", err)
		return nil
	}
	lib, err := Load(rt, Options{})
	if err != nil {
		noGPU("no GPU test: %v", err)
		return nil
	}
	return lib
}

func mustDo(tb testing.TB, errs ...error) {
	tb.Helper()
	if err := errors.Join(errs...); err != nil {
		tb.Fatal(err)
	}
}

func TestGPUDescribeAndPlace(t *testing.T) {
	lib := realLibrary(t)
	rt := lib.Runtime()
	n, _ := rt.DeviceCount()
	p, err := Place(rt, 0, n)
	if err != nil {
		t.Fatal(err)
	}
	info, err := rt.Describe(p.Device)
	if err != nil {
		t.Fatal(err)
	}
	free, total, err := rt.MemInfo(p.Device)
	if err != nil {
		t.Fatal(err)
	}
	// CUDA and NVML, asked independently, agree on the device's memory, except that CUDA
	// leaves out what the driver reserves for itself (on an H200 with driver 580: 150,109,880,320
	// of NVML's 150,755,311,616 bytes, 0.4% less).
	if total > info.MemoryTotal || total < info.MemoryTotal/100*98 || free > total || info.Name == "" {
		t.Errorf("NVML %+v, CUDA total %d free %d", info, total, free)
	}
	v, _ := rt.Version()
	d, _ := rt.DriverVersion()
	t.Logf("%v; CUDA runtime %d (%s), driver %d, NCCL %s (%s)", info, v, rt.Path(), d, lib.VersionString(), lib.Path())
	// scripts/gpu-check.sh reads this line to size its multi-GPU job: the count CUDA sees
	// (CUDA_VISIBLE_DEVICES applied), which nvidia-smi does not give.
	t.Logf("CUDA devices: %d", n)
	if _, err := Place(rt, 0, n+1); err == nil {
		t.Errorf("%d ranks on %d GPUs placed", n+1, n)
	}
}

func TestGPUPinnedStagingRoundTrip(t *testing.T) {
	lib := realLibrary(t)
	rt := lib.Runtime()
	const size = 8 << 20
	pinned, err := rt.AllocPinned(0, 2*size)
	mustDo(t, err)
	defer pinned.Close()
	dev, err := rt.AllocDevice(0, size)
	mustDo(t, err)
	defer dev.Close()
	s, err := rt.NewStream(0)
	mustDo(t, err)
	defer s.Close()
	host := pinned.Bytes()
	r := rand.New(rand.NewPCG(1, 2))
	for i := range host[:size] {
		host[i] = byte(r.Uint32())
	}
	clear(host[size:])
	mustDo(t, s.CopyToDevice(dev, 0, pinned, 0, size), s.CopyToHost(pinned, size, dev, 0, size), s.Synchronize())
	if !bytes.Equal(host[:size], host[size:]) {
		t.Fatal("host -> device -> host changed the bytes")
	}
}

// oneRankComm is a communicator of size 1 on device 0.
func oneRankComm(t *testing.T, lib *Library) *Comm {
	id, err := lib.GetUniqueID()
	mustDo(t, err)
	s, err := lib.Runtime().NewStream(0)
	mustDo(t, err)
	c, err := lib.NewComm(s, 1, 0, id)
	mustDo(t, err)
	t.Cleanup(func() { c.Close() })
	return c
}

// roundTrip stages in to the device, runs op there and stages the result back.
func roundTrip(t *testing.T, c *Comm, in []byte, op func(*DeviceBuffer) error) []byte {
	t.Helper()
	rt := c.lib.rt
	pinned, err := rt.AllocPinned(c.dev, len(in))
	mustDo(t, err)
	defer pinned.Close()
	dev, err := rt.AllocDevice(c.dev, len(in))
	mustDo(t, err)
	defer dev.Close()
	copy(pinned.Bytes(), in)
	s := c.Stream()
	mustDo(t, s.CopyToDevice(dev, 0, pinned, 0, len(in)), op(dev), s.CopyToHost(pinned, 0, dev, 0, len(in)), s.Synchronize())
	return bytes.Clone(pinned.Bytes())
}

func TestGPUCollectivesOneRank(t *testing.T) {
	lib := realLibrary(t)
	c := oneRankComm(t, lib)
	// With one rank, every reduction and the broadcast return the input exactly (the values
	// are small integers and quarters, exact in every type).
	const count = 1024
	for _, dt := range []DataType{Float32, Float16, Int32, Float64} {
		in := make([]byte, count*dt.Size())
		for i := 0; i < count; i++ {
			v := float64(i%400-200) / 4
			switch dt {
			case Float32:
				binary.LittleEndian.PutUint32(in[4*i:], math.Float32bits(float32(v)))
			case Float16:
				binary.LittleEndian.PutUint16(in[2*i:], float16.Fromfloat32(float32(v)).Bits())
			case Int32:
				binary.LittleEndian.PutUint32(in[4*i:], uint32(int32(i-500)))
			case Float64:
				binary.LittleEndian.PutUint64(in[8*i:], math.Float64bits(v))
			}
		}
		for _, op := range []RedOp{Sum, Avg, Min, Max, Prod} {
			got := roundTrip(t, c, in, func(d *DeviceBuffer) error { return c.AllReduce(d, count, dt, op) })
			if !bytes.Equal(got, in) {
				t.Errorf("allreduce %v %v of one rank changed the data", op, dt)
			}
		}
	}
	in := []byte("broadcast of one rank leaves the bytes as they are")
	got := roundTrip(t, c, in, func(d *DeviceBuffer) error { return c.Broadcast(d, len(in), Uint8, 0) })
	if !bytes.Equal(got, in) {
		t.Error("broadcast of one rank changed the data")
	}
	if err := c.AsyncError(); err != nil {
		t.Error(err)
	}
}

// TestGPUAllreduceTwoDevices runs two ranks in one process, one per GPU, with rank-dependent
// inputs and exact expected sums (needs 2 GPUs).
func TestGPUAllreduceTwoDevices(t *testing.T) {
	lib := realLibrary(t)
	if n, _ := lib.Runtime().DeviceCount(); n < 2 {
		t.Skipf("needs 2 GPUs, this machine has %d", n)
	}
	id, err := lib.GetUniqueID()
	mustDo(t, err)
	const count = 1 << 16
	results := make([][]float32, 2)
	errs := make([]error, 2)
	var wg sync.WaitGroup
	for rank := 0; rank < 2; rank++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs[rank] = func() error {
				stream, err := lib.Runtime().NewStream(rank)
				if err != nil {
					return err
				}
				c, err := lib.NewComm(stream, 2, rank, id)
				if err != nil {
					stream.Close()
					return err
				}
				defer c.Close()
				rt := lib.Runtime()
				pinned, err := rt.AllocPinned(rank, 4*count)
				if err != nil {
					return err
				}
				defer pinned.Close()
				dev, err := rt.AllocDevice(rank, 4*count)
				if err != nil {
					return err
				}
				defer dev.Close()
				h := pinned.Bytes()
				for i := 0; i < count; i++ {
					binary.LittleEndian.PutUint32(h[4*i:], math.Float32bits(float32(i*(rank+1))))
				}
				s := c.Stream()
				if err := errors.Join(s.CopyToDevice(dev, 0, pinned, 0, 4*count), c.AllReduce(dev, count, Float32, Sum),
					s.CopyToHost(pinned, 0, dev, 0, 4*count), s.Synchronize()); err != nil {
					return err
				}
				out := make([]float32, count)
				for i := range out {
					out[i] = math.Float32frombits(binary.LittleEndian.Uint32(h[4*i:]))
				}
				results[rank] = out
				return nil
			}()
		}()
	}
	wg.Wait()
	mustDo(t, errs...)
	for rank, out := range results {
		for i, v := range out {
			if v != float32(3*i) {
				t.Fatalf("rank %d element %d = %v, want %v", rank, i, v, float32(3*i))
			}
		}
	}
}

// BenchmarkGPUStaging measures pinned host <-> device copy bandwidth for 128 MiB, the
// default fusion buffer.
func BenchmarkGPUStaging(b *testing.B) {
	lib := realLibrary(b)
	rt := lib.Runtime()
	const size = 128 << 20
	pinned, err := rt.AllocPinned(0, size)
	mustDo(b, err)
	defer pinned.Close()
	dev, err := rt.AllocDevice(0, size)
	mustDo(b, err)
	defer dev.Close()
	s, err := rt.NewStream(0)
	mustDo(b, err)
	defer s.Close()
	b.Run("HostToDevice", func(b *testing.B) {
		b.SetBytes(size)
		for b.Loop() {
			mustDo(b, s.CopyToDevice(dev, 0, pinned, 0, size), s.Synchronize())
		}
	})
	b.Run("DeviceToHost", func(b *testing.B) {
		b.SetBytes(size)
		for b.Loop() {
			mustDo(b, s.CopyToHost(pinned, 0, dev, 0, size), s.Synchronize())
		}
	})
}
