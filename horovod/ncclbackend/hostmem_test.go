package ncclbackend

import (
	"bytes"
	"strings"
	"testing"
	"unsafe"

	"github.com/gorovod/gorovod/horovod/backend"
	"github.com/gorovod/gorovod/horovod/local"
)

// TestLentMemoryMatchesCPUPath runs the collectives with their buffers in memory the backend
// lent (AllocHost) at offsets inside an allocation, with send and recv in one allocation, in two,
// with one side lent and the other in Go memory, and with neither, each against the CPU (local)
// backend byte for byte. Receive buffers start as garbage, so a DMA from or to the wrong place
// shows; sizes span three staging chunks, the last short, at offsets that are not whole chunks.
// While every buffer is lent, the backend must not even have allocated its staging buffer.
func TestLentMemoryMatchesCPUPath(t *testing.T) {
	b := openOneRank(t)
	cpu := local.Backend{}
	const n = 40<<20 + 8
	a, err := b.AllocHost(2*n + 4096)
	if err != nil {
		t.Fatal(err)
	}
	c, err := b.AllocHost(n + 64)
	if err != nil {
		t.Fatal(err)
	}
	lentA, lentA2, lentC := a[1000:1000+n], a[n+2000:2*n+2000], c[64:]
	goSend, goRecv := make([]byte, n), make([]byte, n)
	check := func(what string, send, recv []byte) {
		t.Helper()
		copy(send, randomBytes(len(send), uint64(len(what))))
		want := make([]byte, len(send))
		if err := cpu.Allreduce(send, want, backend.Uint8, backend.Sum); err != nil {
			t.Fatal(err)
		}
		if &recv[0] != &send[0] {
			for i := range recv {
				recv[i] = 0xEE
			}
		}
		if err := b.Allreduce(send, recv, backend.Uint8, backend.Sum); err != nil {
			t.Fatalf("%s: %v", what, err)
		}
		if !bytes.Equal(recv, want) {
			t.Errorf("%s: the allreduce differs from the CPU path", what)
		}
	}
	check("in place in lent memory", lentA, lentA)
	check("lent to lent, one allocation", lentA, lentA2)
	check("lent to lent, two allocations", lentA2, lentC)
	bcast := lentC[5 : 5+3000]
	copy(bcast, randomBytes(3000, 4))
	want := bytes.Clone(bcast)
	if err := b.Broadcast(bcast, 0); err != nil || !bytes.Equal(bcast, want) {
		t.Errorf("broadcast in lent memory: %v", err)
	}
	send, recv := lentA[7:7+777], lentC[1:1+777]
	copy(send, randomBytes(777, 5))
	if err := b.Allgatherv(send, recv, []int{777}); err != nil || !bytes.Equal(recv, send) {
		t.Errorf("allgatherv in lent memory: %v", err)
	}
	if b.pinned != nil {
		t.Errorf("collectives on lent memory only allocated a %d-byte staging buffer", b.pinned.Size())
	}
	check("Go memory to lent", goSend, lentC)
	check("lent to Go memory", lentA2, goRecv)
	check("Go memory to Go memory", goSend, goRecv)
	copy(goSend[:777], randomBytes(777, 6))
	if err := b.Allgatherv(goSend[:777], lentC[3:3+777], []int{777}); err != nil || !bytes.Equal(lentC[3:3+777], goSend[:777]) {
		t.Errorf("allgatherv from Go into lent memory: %v", err)
	}
	if err := b.Allgatherv(lentA[:777], goRecv[:777], []int{777}); err != nil || !bytes.Equal(goRecv[:777], lentA[:777]) {
		t.Errorf("allgatherv from lent into Go memory: %v", err)
	}

	// Mapping slices back: inside at an offset, the last byte, running past the end, Go memory.
	if p, off, ok := b.lent.find(lentA2); !ok || off != n+2000 || p.Size() != len(a) {
		t.Errorf("find(lentA2) = %v, %d, %v", p, off, ok)
	}
	if _, off, ok := b.lent.find(a[len(a)-1:]); !ok || off != len(a)-1 {
		t.Errorf("find(last byte) = %d, %v", off, ok)
	}
	past := unsafe.Slice(&a[len(a)-10], 20) // never read: only its address range is looked up
	if _, _, ok := b.lent.find(past); ok {
		t.Error("a slice running past its allocation's end was taken for lent memory")
	}
	if _, _, ok := b.lent.find(goSend); ok {
		t.Error("Go memory was taken for lent memory")
	}
	if err := b.FreeHost(c[64:]); err == nil || !strings.Contains(err.Error(), "not memory AllocHost returned") {
		t.Errorf("FreeHost of a slice inside an allocation: %v", err)
	}
	if err := b.FreeHost(c[:1]); err == nil || !strings.Contains(err.Error(), "not memory AllocHost returned") {
		t.Errorf("FreeHost of the first byte of an allocation: %v", err)
	}
	if _, _, ok := b.lent.find(lentC); !ok {
		t.Fatal("a refused FreeHost freed the allocation")
	}
	if err := b.FreeHost(c); err != nil {
		t.Fatal(err)
	}
	if _, _, ok := b.lent.find(lentC); ok {
		t.Error("freed memory is still taken for lent memory")
	}
	if err := b.FreeHost(c); err == nil {
		t.Error("a second FreeHost of the same memory succeeded")
	}
}

// TestLentMemoryAfterClose: Close frees what is still lent, FreeHost then does nothing, and
// AllocHost refuses.
func TestLentMemoryAfterClose(t *testing.T) {
	fakeUnlessGPU(t)
	b, err := Open(local.Backend{}, Config{Logf: t.Logf})
	if err != nil {
		t.Fatal(err)
	}
	mem, err := b.AllocHost(1 << 20)
	if err != nil {
		t.Fatal(err)
	}
	if err := b.Close(); err != nil {
		t.Fatal(err)
	}
	if len(b.lent.allocs) != 0 {
		t.Errorf("%d allocations left after Close", len(b.lent.allocs))
	}
	if err := b.FreeHost(mem); err != nil {
		t.Errorf("FreeHost after Close: %v", err)
	}
	if _, err := b.AllocHost(1); err == nil || !strings.Contains(err.Error(), "after Close") {
		t.Errorf("AllocHost after Close: %v", err)
	}
}

// TestAllreducePartlyOverlappingLentBuffers: send and recv in one lent allocation, recv = send
// shifted by 4 MiB either way, over three staging chunks. backend.Backend forbids such buffers,
// but the backend must not corrupt them if given them: DMAing both where they are, a chunk's
// result would land on send's later chunks before they are read. The result must be the CPU
// path's (at size 1: send as it was).
func TestAllreducePartlyOverlappingLentBuffers(t *testing.T) {
	b := openOneRank(t)
	cpu := local.Backend{}
	const n, d = 40 << 20, 4 << 20
	a, err := b.AllocHost(n + d)
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		name       string
		send, recv []byte
	}{
		{"recv after send", a[:n], a[d : d+n]},
		{"recv before send", a[d : d+n], a[:n]},
	} {
		copy(c.send, randomBytes(n, 9))
		want := make([]byte, n)
		if err := cpu.Allreduce(bytes.Clone(c.send), want, backend.Uint8, backend.Sum); err != nil {
			t.Fatal(err)
		}
		if err := b.Allreduce(c.send, c.recv, backend.Uint8, backend.Sum); err != nil {
			t.Fatalf("%s: %v", c.name, err)
		}
		if !bytes.Equal(c.recv, want) {
			t.Errorf("%s: the allreduce differs from the CPU path", c.name)
		}
	}
}
