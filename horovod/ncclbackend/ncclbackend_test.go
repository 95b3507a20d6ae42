package ncclbackend

import (
	"bytes"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"unsafe"

	"github.com/gorovod/gorovod/horovod/backend"
	"github.com/gorovod/gorovod/horovod/fp16"
	"github.com/gorovod/gorovod/horovod/internal/parallel"
	"github.com/gorovod/gorovod/horovod/local"
	"github.com/gorovod/gorovod/nccl"
)

// setupFakeLibraries points discovery at nccl's test stand-in for libcudart and libnccl
// (nccl/testdata/fakelib.c, built here with gcc): one "device" whose memory is host memory and
// collectives that compute nothing. In a job of size 1 the right result of every collective
// is its input, so on CPU machines these tests check the adapter's staging (chunking,
// offsets, padding and compaction, error paths), not NCCL.
func setupFakeLibraries(t testing.TB) {
	t.Helper()
	// gcc is always there where the package is built (cgo needs it), but a GPU host may run a
	// prebuilt test binary (scripts/gpu-check.sh --prebuilt) without a compiler: there the
	// stand-in tests skip and the real-GPU tests still run.
	if _, err := exec.LookPath("gcc"); err != nil {
		t.Skipf("gcc is not on PATH to build the fake CUDA runtime and NCCL (nccl/testdata/fakelib.c): %v", err)
	}
	dir := t.TempDir()
	for _, v := range []struct{ name, def string }{{"libcudart.so", "-DFAKE_CUDA"}, {"libnccl.so", "-DFAKE_NCCL"}} {
		out := filepath.Join(dir, v.name)
		if b, err := exec.Command("gcc", "-shared", "-fPIC", "-o", out, v.def, "../../nccl/testdata/fakelib.c").CombinedOutput(); err != nil {
			t.Fatalf("building the fake library: %v\n%s", err, b)
		}
	}
	t.Setenv("GOROVOD_CUDART_LIBRARY", filepath.Join(dir, "libcudart.so"))
	t.Setenv("GOROVOD_NCCL_LIBRARY", filepath.Join(dir, "libnccl.so"))
	t.Setenv("FAKE_CUDA_DEVICES", "1")
	t.Setenv("FAKE_FAIL", "")
}

// fakeUnlessGPU leaves discovery to find the real libraries where a GPU is available and
// points it at the fake ones elsewhere (unless GOROVOD_REQUIRE_GPU is set, as
// scripts/gpu-check.sh does: then a missing GPU is a failure).
func fakeUnlessGPU(t testing.TB) {
	t.Helper()
	err := usable(nccl.Options{}, local.Backend{}.Topology())
	if err == nil {
		return
	}
	var nf *nccl.LibraryNotFoundError
	var nd *nccl.NoDeviceError
	if os.Getenv("GOROVOD_REQUIRE_GPU") != "" || !errors.As(err, &nf) && !errors.As(err, &nd) {
		t.Fatal(err)
	}
	t.Logf("no GPU (%v); using the fake libraries", strings.SplitN(err.Error(), "\n", 2)[0])
	setupFakeLibraries(t)
}

// openOneRank opens the backend in a job of one process, over the real libraries where a GPU
// is available, else over the fake ones (fakeUnlessGPU).
func openOneRank(t testing.TB) *Backend {
	t.Helper()
	fakeUnlessGPU(t)
	var logs []string
	logf := func(f string, a ...any) { logs = append(logs, fmt.Sprintf(f, a...)) }
	b, err := Open(local.Backend{}, Config{Logf: logf})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := b.Close(); err != nil {
			t.Error(err)
		}
	})
	if len(logs) != 1 || !strings.HasPrefix(logs[0], "ncclbackend: rank 0 (local rank 0): ") {
		t.Errorf("placement log %q", logs)
	}
	t.Log(logs[0])
	return b
}

func randomBytes(n int, seed uint64) []byte {
	r := rand.New(rand.NewPCG(seed, 7))
	b := make([]byte, n)
	for i := range b {
		b[i] = byte(r.Uint32())
	}
	return b
}

func TestOpenWithoutLibrariesIsTyped(t *testing.T) {
	t.Setenv("GOROVOD_CUDART_LIBRARY", "/nonexistent/libcudart.so.12")
	_, err := Open(local.Backend{}, Config{})
	var nf *nccl.LibraryNotFoundError
	if !errors.As(err, &nf) || nf.Library != "CUDA runtime" {
		t.Fatalf("err = %v, want *nccl.LibraryNotFoundError", err)
	}
	if !strings.Contains(err.Error(), "rank 0") || !strings.Contains(err.Error(), "ranks failing setup: [0]") {
		t.Errorf("message %q", err)
	}
	// Through horovod's hook too.
	if _, err := Opener(Config{})(local.Backend{}); !errors.As(err, &nf) {
		t.Errorf("Opener: %v", err)
	}
}

func TestOpenNoDeviceIsTyped(t *testing.T) {
	setupFakeLibraries(t)
	t.Setenv("FAKE_FAIL", "cudaGetDeviceCount:100")
	_, err := Open(local.Backend{}, Config{Logf: t.Logf})
	var nd *nccl.NoDeviceError
	if !errors.As(err, &nd) {
		t.Fatalf("err = %v, want *nccl.NoDeviceError", err)
	}
}

// abortRecorder is a job of one rank whose Abort is recorded instead of exiting.
type abortRecorder struct {
	local.Backend
	aborted *int
}

func (a abortRecorder) Abort(code int) { *a.aborted = code }

// The device's CUDA context is set up (the stream made) before the ranks agree, so a GPU that
// fails there (out of memory, or held by another process in exclusive mode) fails every rank
// alike; a failure in ncclCommInitRank itself, which the other ranks wait on without a timeout,
// ends the job, saying why, rather than leave it hanging.
func TestSetupFailuresNeverLeaveTheOtherRanksWaiting(t *testing.T) {
	setupFakeLibraries(t)
	aborted := -1
	control := abortRecorder{aborted: &aborted}
	t.Setenv("FAKE_FAIL", "cudaStreamCreateWithFlags:2")
	_, err := Open(control, Config{Logf: t.Logf})
	if err == nil || !strings.Contains(err.Error(), "cudaStreamCreateWithFlags") || !strings.Contains(err.Error(), "ranks failing setup: [0]") || aborted != -1 {
		t.Errorf("stream failure: %v (abort %d); want the agreed setup error, no abort", err, aborted)
	}
	t.Setenv("FAKE_FAIL", "ncclCommInitRank:2")
	var logs []string
	_, err = Open(control, Config{Logf: func(f string, a ...any) { logs = append(logs, fmt.Sprintf(f, a...)) }})
	if err == nil || !strings.Contains(err.Error(), "ncclCommInitRank") || aborted != 1 ||
		!strings.Contains(strings.Join(logs, "\n"), "aborting the job, since the other ranks wait for this one in ncclCommInitRank") {
		t.Errorf("init failure: %v (abort %d, logs %q); want an abort with code 1, logged", err, aborted, logs)
	}
}

func TestAutoOpenerChoosesNCCLOnlyWhereItCanOpen(t *testing.T) {
	t.Setenv("GOROVOD_CUDART_LIBRARY", "/nonexistent/libcudart.so.12")
	ctl := local.Backend{}
	data, err := AutoOpener(Config{Logf: t.Logf})(ctl)
	if err != nil || data != backend.Backend(ctl) {
		t.Fatalf("without CUDA: AutoOpener = %v, %v; want the control backend", data, err)
	}

	setupFakeLibraries(t)
	data, err = AutoOpener(Config{Logf: t.Logf})(ctl)
	if err != nil {
		t.Fatal(err)
	}
	defer data.Close()
	if data.Name() != "nccl" {
		t.Fatalf("with a GPU: AutoOpener chose %q, want nccl", data.Name())
	}
}

// scripted is a control backend for agreement tests: rank Rank of Size, whose Allgatherv
// returns the statuses of the other ranks as given.
type scripted struct {
	local.Backend
	topo     backend.Topology
	statuses []byte
	err      error
}

func (s scripted) Topology() backend.Topology { return s.topo }
func (s scripted) Allgatherv(send, recv []byte, counts []int) error {
	if s.err != nil {
		return s.err
	}
	if !slices.Equal(counts, slices.Repeat([]int{1}, s.topo.Size)) || len(send) != 1 {
		return errors.New("unexpected allgatherv shape")
	}
	copy(recv, s.statuses)
	recv[s.topo.Rank] = send[0]
	return nil
}

func TestAgreementNamesFailingRanks(t *testing.T) {
	topo := backend.Topology{Rank: 1, Size: 4, LocalSize: 4, LocalRank: 1}
	ctl := scripted{topo: topo, statuses: []byte{0, 0, 1, 1}}
	err := agree(ctl, topo, nil)
	if err == nil || err.Error() != "ncclbackend: rank 1 is ready, but ranks [2 3] could not set up NCCL (see their errors)" {
		t.Errorf("healthy rank: %v", err)
	}
	mine := errors.New("no GPU here")
	err = agree(ctl, topo, mine)
	if !errors.Is(err, mine) || !strings.Contains(err.Error(), "ranks failing setup: [1 2 3]") {
		t.Errorf("failing rank: %v", err)
	}
	if err := agree(scripted{topo: topo, statuses: make([]byte, 4)}, topo, nil); err != nil {
		t.Errorf("all ready: %v", err)
	}
	broken := errors.New("control down")
	if err := agree(scripted{topo: topo, err: broken}, topo, mine); !errors.Is(err, broken) || !errors.Is(err, mine) {
		t.Errorf("control failure: %v", err)
	}
}

// TestCollectivesMatchCPUPath runs every collective through the NCCL backend and through the
// CPU (local) backend on the same inputs and compares the bytes.
func TestCollectivesMatchCPUPath(t *testing.T) {
	b := openOneRank(t)
	if b.Name() != "nccl" || b.Topology() != (local.Backend{}).Topology() {
		t.Fatal("name or topology")
	}
	cpu := local.Backend{}
	// 40 MiB + 6 bytes: three chunks, the last one short.
	for _, n := range []int{8, 40<<20 + 8} {
		for _, dt := range []backend.DType{backend.Float32, backend.Float16, backend.Int64, backend.Uint8} {
			send := randomBytes(n, uint64(n)+uint64(dt))
			want := make([]byte, n)
			if err := cpu.Allreduce(send, want, dt, backend.Sum); err != nil {
				t.Fatal(err)
			}
			got := make([]byte, n)
			if err := b.Allreduce(send, got, dt, backend.Sum); err != nil {
				t.Fatal(err)
			}
			if !bytes.Equal(got, want) {
				t.Fatalf("allreduce %v of %d bytes differs from the CPU path", dt, n)
			}
		}
	}
	inPlace := randomBytes(1000, 3)
	want := bytes.Clone(inPlace)
	if err := b.Allreduce(inPlace, inPlace, backend.Float64, backend.Max); err != nil || !bytes.Equal(inPlace, want) {
		t.Errorf("in-place allreduce: %v", err)
	}
	buf := randomBytes(3000, 4)
	want = bytes.Clone(buf)
	if err := b.Broadcast(buf, 0); err != nil || !bytes.Equal(buf, want) {
		t.Errorf("broadcast: %v", err)
	}
	send := randomBytes(777, 5)
	recv := make([]byte, 777)
	if err := b.Allgatherv(send, recv, []int{777}); err != nil || !bytes.Equal(recv, send) {
		t.Errorf("allgatherv: %v", err)
	}
	if err := b.Barrier(); err != nil {
		t.Error(err)
	}
	// Empty buffers are no-ops.
	if err := errors.Join(b.Allreduce(nil, nil, backend.Float32, backend.Sum), b.Broadcast(nil, 0), b.Allgatherv(nil, nil, []int{0})); err != nil {
		t.Error(err)
	}
}

func TestArgumentErrors(t *testing.T) {
	b := openOneRank(t)
	for _, tc := range []struct {
		err  error
		want string
	}{
		{b.Allreduce(make([]byte, 8), make([]byte, 4), backend.Float32, backend.Sum), "allreduce of 8 bytes into 4 bytes of float32"},
		{b.Allreduce(make([]byte, 6), make([]byte, 6), backend.Float32, backend.Sum), "allreduce of 6 bytes into 6 bytes of float32"},
		{b.Allreduce(make([]byte, 8), make([]byte, 8), backend.DType(0), backend.Sum), "unknown dtype"},
		{b.Allreduce(make([]byte, 8), make([]byte, 8), backend.Float32, backend.ReduceOp(9)), "unknown reduction"},
		{b.Broadcast(make([]byte, 8), 1), "broadcast root 1 in a job of size 1"},
		{b.Allgatherv(make([]byte, 8), make([]byte, 8), []int{4}), "counts [4] for rank 0 of 1 sending 8 bytes"},
		{b.Allgatherv(make([]byte, 8), make([]byte, 9), []int{8}), "sum to 8, receive buffer has 9 bytes"},
		{b.Allgatherv(make([]byte, 8), make([]byte, 8), []int{8, 1}), "counts [8 1]"},
	} {
		if tc.err == nil || !strings.Contains(tc.err.Error(), tc.want) {
			t.Errorf("err = %v, want %q", tc.err, tc.want)
		}
	}
}

func TestDataTypeMapping(t *testing.T) {
	want := map[backend.DType]nccl.DataType{backend.Uint8: nccl.Uint8, backend.Int8: nccl.Int8, backend.Int32: nccl.Int32,
		backend.Int64: nccl.Int64, backend.Float16: nccl.Float16, backend.Float32: nccl.Float32, backend.Float64: nccl.Float64,
		backend.BFloat16: nccl.Bfloat16}
	for _, dt := range backend.DTypes {
		got, err := ncclType(dt)
		if err != nil || got != want[dt] || got.Size() != dt.Size() {
			t.Errorf("%v -> %v, %v", dt, got, err)
		}
	}
	for op, w := range map[backend.ReduceOp]nccl.RedOp{backend.Sum: nccl.Sum, backend.Min: nccl.Min, backend.Max: nccl.Max, backend.Product: nccl.Prod} {
		if got, err := ncclOp(op); got != w || err != nil {
			t.Errorf("%v -> %v, %v", op, got, err)
		}
	}
}

// TestErrorsNameTheCollective runs over the fake libraries only: it makes NCCL fail.
func TestErrorsNameTheCollective(t *testing.T) {
	setupFakeLibraries(t)
	b, err := Open(local.Backend{}, Config{Logf: t.Logf})
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	t.Setenv("FAKE_FAIL", "ncclAllReduce:5,ncclBroadcast:5,ncclAllGather:5")
	var ne *nccl.NCCLError
	for _, tc := range []struct {
		err  error
		want string
	}{
		{b.Allreduce(make([]byte, 8), make([]byte, 8), backend.Float32, backend.Sum), "ncclbackend: allreduce on rank 0"},
		{b.Broadcast(make([]byte, 8), 0), "ncclbackend: broadcast on rank 0"},
		{b.Allgatherv(make([]byte, 8), make([]byte, 8), []int{8}), "ncclbackend: allgatherv on rank 0"},
		{b.Barrier(), "ncclbackend: barrier on rank 0"},
	} {
		if !errors.As(tc.err, &ne) || ne.Code != nccl.InvalidUsage || !strings.HasPrefix(tc.err.Error(), tc.want) {
			t.Errorf("err = %v, want %q wrapping ncclInvalidUsage", tc.err, tc.want)
		}
	}
	// A peer failure reported asynchronously ends the wait instead of hanging it.
	t.Setenv("FAKE_FAIL", "cudaStreamQuery:600")
	t.Setenv("FAKE_NCCL_ASYNC_ERR", "6")
	if err := b.Allreduce(make([]byte, 8), make([]byte, 8), backend.Float32, backend.Sum); !errors.As(err, &ne) || ne.Code != nccl.RemoteError {
		t.Errorf("async error: %v", err)
	}
	// The work that could not finish was not left queued on the stream, which may copy into
	// memory the caller frees once the collective has returned: the communicator was aborted,
	// and the backend is broken from then on.
	t.Setenv("FAKE_FAIL", "")
	if err := b.Allreduce(make([]byte, 8), make([]byte, 8), backend.Float32, backend.Sum); err == nil || !strings.Contains(err.Error(), "closed") {
		t.Errorf("allreduce after an asynchronous error: %v, want the aborted communicator's error", err)
	}
	t.Setenv("FAKE_FAIL", "cudaMalloc:2")
	t.Setenv("FAKE_NCCL_ASYNC_ERR", "")
	var ce *nccl.CUDAError
	if err := b.Allreduce(make([]byte, 64<<20), make([]byte, 64<<20), backend.Float32, backend.Sum); !errors.As(err, &ce) {
		t.Errorf("allocation failure: %v", err)
	}
}

// bertBaseParameters is the number of trainable parameters of BERT-base's classifier with two
// labels (109,482,240 in the encoder and pooler, 1,538 in the output layer): the gradients one
// training step averages.
const bertBaseParameters = 109_483_778

// BenchmarkFP16Pipeline is Horovod's fp16-compressed allreduce of 128 MiB of float32
// gradients, the default fusion buffer: compress to float16, stage to the device, reduce,
// stage back, decompress. On a GPU machine it measures the real path (scripts/gpu-check.sh).
func BenchmarkFP16Pipeline(b *testing.B) { benchmarkGradientAllreduce(b, 32<<20, true) }

// BenchmarkStaging is the staging alone: allreduce of 128 MiB of float32 at size 1 is
// host -> pinned -> device -> pinned -> host.
func BenchmarkStaging(b *testing.B) { benchmarkGradientAllreduce(b, 32<<20, false) }

// BenchmarkBERTBaseStep is what one BERT-base training step's gradients cost to move through
// the host staging at size 1, uncompressed and fp16-compressed (the performance note in
// README's GPUs section).
func BenchmarkBERTBaseStep(b *testing.B) {
	b.Run("float32", func(b *testing.B) { benchmarkGradientAllreduce(b, bertBaseParameters, false) })
	b.Run("fp16", func(b *testing.B) { benchmarkGradientAllreduce(b, bertBaseParameters, true) })
}

// benchmarkGradientAllreduce allreduces n float32 gradients at size 1, compressed to float16
// first when compress is set, and checks that they come back unchanged. It converts as
// horovod's Reducer does in a job of one process per machine (finetune on one GPU): over
// parallel.Workers(1) goroutines, and widening without a scale (the average over one rank).
func benchmarkGradientAllreduce(b *testing.B, n int, compress bool) {
	bk := openOneRank(b)
	workers := parallel.Workers(1)
	grads := make([]float32, n)
	for i := range grads {
		grads[i] = float32(i%1000-500) / 1024 // exact in float16
	}
	out := make([]float32, n)
	var half []uint16
	if compress {
		half = make([]uint16, n)
	}
	allreduce := func() {
		if compress {
			fp16.EncodeFloat32Parallel(half, grads, workers)
			halfBytes := unsafe.Slice((*byte)(unsafe.Pointer(&half[0])), 2*n)
			if err := bk.Allreduce(halfBytes, halfBytes, backend.Float16, backend.Sum); err != nil {
				b.Fatal(err)
			}
			fp16.DecodeFloat32Parallel(out, half, workers)
			return
		}
		send := unsafe.Slice((*byte)(unsafe.Pointer(&grads[0])), 4*n)
		recv := unsafe.Slice((*byte)(unsafe.Pointer(&out[0])), 4*n)
		if err := bk.Allreduce(send, recv, backend.Float32, backend.Sum); err != nil {
			b.Fatal(err)
		}
	}
	// The first call allocates the pinned and device buffers, which the backend then reuses
	// step after step: it is setup, not staging, and stays out of the timing.
	allreduce()
	b.SetBytes(int64(4 * n))
	for b.Loop() {
		clear(out[:1]) // the timed calls' own result is checked below, not the setup call's
		allreduce()
	}
	if !slices.Equal(out, grads) { // one rank sums to itself
		b.Fatal("the allreduce at size 1 changed the gradients")
	}
}

// TestAutoOpenerFallbackIsOneLine checks what AutoOpener logs when it keeps the collectives on
// the control backend: on machines without CUDA every rank of every job falls back, so that
// must cost one line from rank 0 in the whole job, not each rank's list of places searched.
func TestAutoOpenerFallbackIsOneLine(t *testing.T) {
	const hint = "--allreduce_backend=nccl reports each rank's full reason"
	autoLogs := func(topo backend.Topology, statuses []byte) []string {
		t.Helper()
		var logs []string
		logf := func(f string, a ...any) { logs = append(logs, fmt.Sprintf(f, a...)) }
		ctl := &scripted{topo: topo, statuses: statuses}
		data, err := AutoOpener(Config{Logf: logf, FullReasonHint: hint})(ctl)
		if err != nil || data != backend.Backend(ctl) {
			t.Fatalf("rank %d: AutoOpener = %v, %v; want the control backend", topo.Rank, data, err)
		}
		return logs
	}
	rank := func(r, size int) backend.Topology {
		return backend.Topology{Rank: r, Size: size, LocalRank: 0, LocalSize: 1}
	}

	t.Setenv("GOROVOD_CUDART_LIBRARY", "/nonexistent/libcudart.so.12")
	want := []string{"ncclbackend: collectives stay on local: no rank can use NCCL (rank 0: CUDA runtime library not found; " + hint + ")"}
	if got := autoLogs(rank(0, 2), []byte{0, 1}); !slices.Equal(got, want) {
		t.Errorf("no CUDA anywhere, rank 0 logs %q, want %q", got, want)
	}
	if got := autoLogs(rank(1, 2), []byte{1, 0}); got != nil {
		t.Errorf("no CUDA anywhere, rank 1 logs %q, want nothing", got)
	}
	want = []string{"ncclbackend: collectives stay on local: ranks [0 2] cannot use NCCL (rank 0: CUDA runtime library not found; " + hint + ")"}
	if got := autoLogs(rank(0, 3), []byte{0, 0, 1}); !slices.Equal(got, want) {
		t.Errorf("ranks 0 and 2 without CUDA, rank 0 logs %q, want %q", got, want)
	}
	// Rank 0 is ready and cannot say why rank 1 is not: rank 1 does, in brief.
	want = []string{"ncclbackend: rank 1 cannot use NCCL: CUDA runtime library not found"}
	if got := autoLogs(rank(1, 2), []byte{0, 0}); !slices.Equal(got, want) {
		t.Errorf("rank 1 alone without CUDA, rank 1 logs %q, want %q", got, want)
	}

	setupFakeLibraries(t)
	want = []string{"ncclbackend: collectives stay on local: ranks [1] cannot use NCCL (" + hint + ")"}
	if got := autoLogs(rank(0, 2), []byte{0, 1}); !slices.Equal(got, want) {
		t.Errorf("rank 1 alone without CUDA, rank 0 logs %q, want %q", got, want)
	}
	// Another reason than a missing library is its own first line.
	t.Setenv("FAKE_FAIL", "cudaGetDeviceCount:100")
	got := autoLogs(rank(0, 1), nil)
	if len(got) != 1 || !strings.Contains(got[0], "(rank 0: no usable CUDA device: ") {
		t.Errorf("no device: %q", got)
	}
}
