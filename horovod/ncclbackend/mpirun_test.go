package ncclbackend

import (
	"bytes"
	"encoding/binary"
	"errors"
	"math"
	"os"
	"strings"
	"testing"

	"github.com/gorovod/gorovod/horovod/backend"
	"github.com/gorovod/gorovod/horovod/fp16"
	"github.com/gorovod/gorovod/horovod/mpi"
	"github.com/gorovod/gorovod/nccl"
)

// TestAgainstMPIUnderMpirun checks the NCCL backend against the MPI (CPU) backend in a real
// job: every rank reduces, broadcasts and gathers the same rank-dependent data through both
// and compares the bytes. It runs only under mpirun on a machine with a GPU per rank
// (scripts/gpu-check.sh starts it when it finds two or more GPUs):
//
//	go test -c -o ncclbackend.test ./horovod/ncclbackend && mpirun -np 2 ./ncclbackend.test -test.run UnderMpirun
func TestAgainstMPIUnderMpirun(t *testing.T) {
	if os.Getenv("OMPI_COMM_WORLD_SIZE") == "" {
		t.Skip("runs under mpirun (scripts/gpu-check.sh)")
	}
	ctl, err := mpi.Open(backend.DriverConfig{})
	if err != nil {
		t.Fatal(err)
	}
	defer ctl.Close()
	b, err := Open(ctl, Config{Logf: t.Logf})
	if err != nil {
		// Every rank gets an error here when one does (Open agrees over MPI first).
		var nf *nccl.LibraryNotFoundError
		var nd *nccl.NoDeviceError
		if os.Getenv("GOROVOD_REQUIRE_GPU") == "" && (errors.As(err, &nf) || errors.As(err, &nd)) {
			t.Skipf("no GPU: %v", err)
		}
		t.Fatal(err)
	}
	defer b.Close()
	topo := b.Topology()
	rank := topo.Rank

	// Small integers (and halves of them) plus the rank: every sum is exact in every type, so
	// both backends must agree bit for bit whatever order they add in.
	encode := func(dt backend.DType, count int) []byte {
		out := make([]byte, count*dt.Size())
		for i := 0; i < count; i++ {
			v := float64(i%97-48)/2 + float64(rank)
			switch dt {
			case backend.Float16:
				binary.LittleEndian.PutUint16(out[2*i:], fp16.FromFloat64(v))
			case backend.Float32:
				binary.LittleEndian.PutUint32(out[4*i:], math.Float32bits(float32(v)))
			case backend.Float64:
				binary.LittleEndian.PutUint64(out[8*i:], math.Float64bits(v))
			case backend.Int32:
				binary.LittleEndian.PutUint32(out[4*i:], uint32(int32(2*v)))
			case backend.Int64:
				binary.LittleEndian.PutUint64(out[8*i:], uint64(int64(2*v)))
			}
		}
		return out
	}
	check := func(what string, viaNCCL, viaMPI func() ([]byte, error)) {
		t.Helper()
		got, err := viaNCCL()
		if err != nil {
			t.Fatalf("%s over NCCL: %v", what, err)
		}
		want, err := viaMPI()
		if err != nil {
			t.Fatalf("%s over MPI: %v", what, err)
		}
		if !bytes.Equal(got, want) {
			t.Fatalf("rank %d: %s: NCCL and MPI disagree", rank, what)
		}
	}
	reduce := func(bk backend.Backend, send []byte, dt backend.DType, op backend.ReduceOp) func() ([]byte, error) {
		return func() ([]byte, error) {
			out := make([]byte, len(send))
			return out, bk.Allreduce(send, out, dt, op)
		}
	}
	for _, dt := range []backend.DType{backend.Float32, backend.Float16, backend.Float64, backend.Int32, backend.Int64} {
		send := encode(dt, 1001)
		ops := []backend.ReduceOp{backend.Sum, backend.Min, backend.Max, backend.Product}
		if dt == backend.Float16 {
			// A product of these values over more than two ranks can round in float16, and then
			// depends on the order the backend multiplies in.
			ops = ops[:3]
		}
		for _, op := range ops {
			check("allreduce "+dt.String()+" "+op.String(), reduce(b, send, dt, op), reduce(ctl, send, dt, op))
		}
	}
	big := encode(backend.Float32, (40<<20)/4+3) // three staging chunks, the last one short
	check("allreduce float32 sum of 40 MiB", reduce(b, big, backend.Float32, backend.Sum), reduce(ctl, big, backend.Float32, backend.Sum))

	for root := 0; root < topo.Size; root++ {
		bcast := func(bk backend.Backend) func() ([]byte, error) {
			return func() ([]byte, error) {
				buf := encode(backend.Float32, 333)
				return buf, bk.Broadcast(buf, root)
			}
		}
		check("broadcast", bcast(b), bcast(ctl))
	}

	counts := make([]int, topo.Size)
	total := 0
	for r := range counts {
		counts[r] = 37*r + 5 // every rank a different length: the padding must not show
		total += counts[r]
	}
	gather := func(bk backend.Backend) func() ([]byte, error) {
		return func() ([]byte, error) {
			send := bytes.Repeat([]byte{byte(rank + 1)}, counts[rank])
			recv := make([]byte, total)
			return recv, bk.Allgatherv(send, recv, counts)
		}
	}
	check("allgatherv", gather(b), gather(ctl))
	if err := b.Barrier(); err != nil {
		t.Fatal(err)
	}
}

// TestSetupAgreementUnderMpirun is run by `make test-gpu-agreement` as a two-rank job in which
// rank 0 can set up NCCL (over the stand-in libraries) and rank 1 cannot (its CUDA runtime path
// is wrong). Both must return from Open with an error naming rank 1, and neither may wait for
// the other in NCCL's initialisation: the make target's timeout turns a hang into a failure.
func TestSetupAgreementUnderMpirun(t *testing.T) {
	if os.Getenv("GOROVOD_TEST_SETUP_AGREEMENT") == "" {
		t.Skip("run under mpirun by make test-gpu-agreement")
	}
	ctl, err := mpi.Open(backend.DriverConfig{})
	if err != nil {
		t.Fatal(err)
	}
	defer ctl.Close()
	_, err = Open(ctl, Config{Logf: t.Logf})
	switch rank := ctl.Topology().Rank; rank {
	case 0:
		if err == nil || err.Error() != "ncclbackend: rank 0 is ready, but ranks [1] could not set up NCCL (see their errors)" {
			t.Errorf("rank 0: %v", err)
		}
	case 1:
		var nf *nccl.LibraryNotFoundError
		if !errors.As(err, &nf) || !strings.Contains(err.Error(), "ranks failing setup: [1]") {
			t.Errorf("rank 1: %v", err)
		}
	default:
		t.Fatalf("rank %d: the job has two ranks", rank)
	}

	// AutoOpener on the same job: rank 1 cannot use NCCL, so every rank keeps the control
	// backend (rank 0, which could open NCCL alone, must not).
	data, err := AutoOpener(Config{Logf: t.Logf})(ctl)
	if err != nil || data != backend.Backend(ctl) {
		t.Errorf("rank %d: AutoOpener = %v, %v; want the control backend", ctl.Topology().Rank, data, err)
	}
}
