// Package ncclbackend is horovod's GPU data backend: it carries the collectives of
// backend.Backend over NCCL (package nccl) while negotiation stays on the control backend
// (MPI). Select it with
//
//	horovod.Init(horovod.WithDataBackend(ncclbackend.Opener(ncclbackend.Config{})))
//
// Each rank uses the GPU of its local rank (nccl.Place) and logs its name, memory and PCI bus
// id. Rank 0 makes the ncclUniqueId and sends it over the control backend. TensorFlow hands the
// gradients back on the host, so every collective stages its buffer through pinned host
// memory to the device and back, in chunks, so that the Go copy of one chunk overlaps the DMA
// and the reduction of the previous ones; the copies use several cores (package
// horovod/internal/parallel). Buffers in pinned memory the backend lent (AllocHost, the
// backend.HostAllocator horovod keeps a Reducer's arenas in) skip the copy on their side.
// float16 reduces as ncclHalf, bfloat16 as ncclBfloat16 (NCCL >= 2.10).
package ncclbackend

import (
	"errors"
	"fmt"
	"log"
	"slices"
	"strings"

	"github.com/gorovod/gorovod/horovod/backend"
	"github.com/gorovod/gorovod/horovod/internal/parallel"
	"github.com/gorovod/gorovod/nccl"
)

// Config configures the backend; the zero value searches for the libraries in the standard
// places (see nccl.Options) and logs with the log package.
type Config struct {
	Libraries nccl.Options
	// Logf receives the one-line placement report of each rank, and AutoOpener's one line when
	// it keeps the collectives on the control backend.
	Logf func(format string, args ...any)
	// FullReasonHint ends AutoOpener's line: how the user gets each rank's full reason (the
	// places searched for a missing library, say). Default: "ncclbackend.Open reports each
	// rank's full reason".
	FullReasonHint string
}

// Opener returns the backend.Opener for horovod.WithDataBackend.
func Opener(cfg Config) backend.Opener {
	return func(control backend.Backend) (backend.Backend, error) { return Open(control, cfg) }
}

// chunkBytes is the unit of the staging pipeline: big enough that per-chunk launch costs
// (a copy and a collective, some microseconds each) vanish against its ~1 ms of transfer at
// PCIe rates, small enough that the first DMA starts early.
const chunkBytes = 16 << 20

// Backend is one rank's NCCL communicator with its staging buffers.
type Backend struct {
	control backend.Backend
	topo    backend.Topology
	lib     *nccl.Library
	device  int          // the CUDA device, chosen by local rank
	stream  *nccl.Stream // the communicator's, made before it
	comm    *nccl.Comm
	// pinned stages host data; dev and gather hold it on the device (gather: allgather's
	// receive side). All grow on demand and are reused.
	pinned      *nccl.PinnedBuffer
	dev, gather *nccl.DeviceBuffer
	// lent is the pinned memory AllocHost handed out, which collectives DMA where it is.
	lent lentMemory
	// copyWorkers is how many goroutines copy between Go memory and the pinned buffer: this
	// rank's share of the machine's cores (one core's copy is several times slower than the DMA).
	copyWorkers int
}

var _ backend.HostAllocator = (*Backend)(nil)

// Open sets up NCCL for the job control describes. Every rank calls it; the ranks agree over
// control on whether each succeeded, so that a rank without a GPU or without NCCL makes every
// rank fail with the same message instead of leaving the others waiting for it.
func Open(control backend.Backend, cfg Config) (*Backend, error) {
	if cfg.Logf == nil {
		cfg.Logf = log.Printf
	}
	b := &Backend{control: control, topo: control.Topology()}
	b.copyWorkers = parallel.Workers(b.topo.LocalSize)
	id, localErr := b.prepare(cfg)
	if err := agree(control, b.topo, localErr); err != nil {
		b.closeStream()
		return nil, err
	}
	if err := control.Broadcast(id[:], 0); err != nil {
		b.closeStream()
		return nil, fmt.Errorf("ncclbackend: sending the ncclUniqueId from rank 0: %w", err)
	}
	comm, err := b.lib.NewComm(b.stream, b.topo.Size, b.topo.Rank, id)
	if err != nil {
		b.closeStream()
		err = fmt.Errorf("ncclbackend: rank %d: %w", b.topo.Rank, err)
		// The other ranks wait in ncclCommInitRank, which has no timeout, for this one: only
		// ending the job frees them (and says why, where a hang would say nothing).
		cfg.Logf("%v: aborting the job, since the other ranks wait for this one in ncclCommInitRank", err)
		control.Abort(1)
		return nil, err
	}
	b.comm = comm
	return b, nil
}

// prepare does this rank's local part of Open: load the libraries, pick and describe the
// GPU, create the communicator's stream (which sets the GPU's CUDA context up: a GPU out of
// memory or held by another process fails here, before the ranks agree) and, on rank 0, make
// the communicator's id.
func (b *Backend) prepare(cfg Config) (nccl.UniqueID, error) {
	rt, err := nccl.LoadRuntime(cfg.Libraries)
	if err != nil {
		return nccl.UniqueID{}, err
	}
	place, err := nccl.Place(rt, b.topo.LocalRank, b.topo.LocalSize)
	if err != nil {
		return nccl.UniqueID{}, err
	}
	b.device = place.Device
	if b.lib, err = nccl.Load(rt, cfg.Libraries); err != nil {
		return nccl.UniqueID{}, err
	}
	info, err := rt.Describe(place.Device)
	if err != nil { // NVML is for the log only: say what is known and go on
		cfg.Logf("ncclbackend: rank %d (local rank %d): GPU %d, PCI %s (%v)", b.topo.Rank, b.topo.LocalRank, place.Device, info.PCIBusID, err)
	} else {
		cfg.Logf("ncclbackend: rank %d (local rank %d): %v; NCCL %s", b.topo.Rank, b.topo.LocalRank, info, b.lib.VersionString())
	}
	if b.stream, err = rt.NewStream(place.Device); err != nil {
		return nccl.UniqueID{}, err
	}
	if b.topo.Rank != 0 {
		return nccl.UniqueID{}, nil
	}
	return b.lib.GetUniqueID()
}

// closeStream closes the stream prepare made, where Open fails before a Comm owns it.
func (b *Backend) closeStream() {
	if b.stream != nil {
		b.stream.Close()
	}
}

// AutoOpener opens NCCL when every rank of the job can (CUDA runtime, a GPU for its local rank,
// NCCL) and otherwise keeps the collectives on the control backend. The ranks decide together:
// a job spread over machines that differ must not split between two backends, where each half
// would wait for the other.
//
// Falling back is the ordinary case on machines without GPUs, so it costs one line, from rank
// 0, with rank 0's reason in brief; a failing rank says why only when rank 0 was ready and
// could not (fallbackLog). The full reasons are Open's errors.
func AutoOpener(cfg Config) backend.Opener {
	return func(control backend.Backend) (backend.Backend, error) {
		if cfg.Logf == nil {
			cfg.Logf = log.Printf
		}
		topo := control.Topology()
		localErr := usable(cfg.Libraries, topo)
		failed, err := failedRanks(control, topo, localErr)
		if err != nil {
			return nil, err
		}
		if len(failed) > 0 {
			if line := fallbackLog(control.Name(), topo, failed, localErr, cfg.FullReasonHint); line != "" {
				cfg.Logf("%s", line)
			}
			return control, nil
		}
		return Open(control, cfg)
	}
}

// fallbackLog is what rank topo.Rank logs when the ranks failed (at least one did) keep the
// collectives on the control backend: rank 0 the decision, with its own reason when it is one
// of them; another rank its reason when rank 0 could not give one; else nothing.
func fallbackLog(control string, topo backend.Topology, failed []int, localErr error, hint string) string {
	if hint == "" {
		hint = "ncclbackend.Open reports each rank's full reason"
	}
	rank0Failed := failed[0] == 0
	switch {
	case topo.Rank == 0:
		who := fmt.Sprintf("ranks %v cannot", failed)
		if len(failed) == topo.Size {
			who = "no rank can"
		}
		if rank0Failed {
			hint = "rank 0: " + brief(localErr) + "; " + hint
		}
		return fmt.Sprintf("ncclbackend: collectives stay on %s: %s use NCCL (%s)", control, who, hint)
	case localErr != nil && !rank0Failed:
		return fmt.Sprintf("ncclbackend: rank %d cannot use NCCL: %s", topo.Rank, brief(localErr))
	}
	return ""
}

// brief is the gist of a setup error in one line: which library is missing rather than every
// place searched for it, else the error's first line.
func brief(err error) string {
	var notFound *nccl.LibraryNotFoundError
	if errors.As(err, &notFound) {
		return notFound.Library + " library not found"
	}
	line, _, _ := strings.Cut(err.Error(), "\n")
	return strings.TrimPrefix(line, "nccl: ")
}

// usable says whether this rank could open NCCL, without creating anything.
func usable(libs nccl.Options, topo backend.Topology) error {
	rt, err := nccl.LoadRuntime(libs)
	if err != nil {
		return err
	}
	if _, err := nccl.Place(rt, topo.LocalRank, topo.LocalSize); err != nil {
		return err
	}
	_, err = nccl.Load(rt, libs)
	return err
}

// failedRanks tells every rank which ranks failed their local setup.
func failedRanks(control backend.Backend, topo backend.Topology, localErr error) ([]int, error) {
	status := []byte{0}
	if localErr != nil {
		status[0] = 1
	}
	all := make([]byte, topo.Size)
	counts := slices.Repeat([]int{1}, topo.Size)
	if err := backend.ControlAllgatherv(control, status, all, counts); err != nil {
		return nil, errors.Join(fmt.Errorf("ncclbackend: agreeing on setup: %w", err), localErr)
	}
	var failed []int
	for r, s := range all {
		if s != 0 {
			failed = append(failed, r)
		}
	}
	return failed, nil
}

// agree tells every rank which ranks failed their local setup, as an error naming them.
func agree(control backend.Backend, topo backend.Topology, localErr error) error {
	failed, err := failedRanks(control, topo, localErr)
	if err != nil {
		return err
	}
	switch {
	case len(failed) == 0:
		return nil
	case localErr != nil:
		return fmt.Errorf("ncclbackend: rank %d: %w (ranks failing setup: %v)", topo.Rank, localErr, failed)
	default:
		return fmt.Errorf("ncclbackend: rank %d is ready, but ranks %v could not set up NCCL (see their errors)", topo.Rank, failed)
	}
}

// Name is "nccl".
func (b *Backend) Name() string { return "nccl" }

// Topology is the control backend's.
func (b *Backend) Topology() backend.Topology { return b.topo }

// ncclType maps horovod's element types; every one has an NCCL twin.
func ncclType(dt backend.DType) (nccl.DataType, error) {
	switch dt {
	case backend.Uint8:
		return nccl.Uint8, nil
	case backend.Int8:
		return nccl.Int8, nil
	case backend.Int32:
		return nccl.Int32, nil
	case backend.Int64:
		return nccl.Int64, nil
	case backend.Float16:
		return nccl.Float16, nil
	case backend.Float32:
		return nccl.Float32, nil
	case backend.Float64:
		return nccl.Float64, nil
	case backend.BFloat16:
		return nccl.Bfloat16, nil
	}
	return 0, fmt.Errorf("ncclbackend: unknown dtype %v", dt)
}

func ncclOp(op backend.ReduceOp) (nccl.RedOp, error) {
	switch op {
	case backend.Sum:
		return nccl.Sum, nil
	case backend.Min:
		return nccl.Min, nil
	case backend.Max:
		return nccl.Max, nil
	case backend.Product:
		return nccl.Prod, nil
	}
	return 0, fmt.Errorf("ncclbackend: unknown reduction %v", op)
}

// capacity rounds n up to whole chunks, so that slowly growing sizes do not reallocate the
// staging buffers every step.
func capacity(n int) int { return (n + chunkBytes - 1) / chunkBytes * chunkBytes }

// stage makes sure the pinned buffer holds n bytes (none is allocated for 0) and *dev holds
// devBytes.
func (b *Backend) stage(n int, dev **nccl.DeviceBuffer, devBytes int) error {
	rt := b.lib.Runtime()
	if n > 0 && (b.pinned == nil || b.pinned.Size() < n) {
		if b.pinned != nil {
			if err := b.pinned.Close(); err != nil {
				return err
			}
			b.pinned = nil
		}
		p, err := rt.AllocPinned(b.device, capacity(n))
		if err != nil {
			return err
		}
		b.pinned = p
	}
	if *dev == nil || (*dev).Size() < devBytes {
		if *dev != nil {
			if err := (*dev).Close(); err != nil {
				return err
			}
			*dev = nil
		}
		d, err := rt.AllocDevice(b.device, capacity(devBytes))
		if err != nil {
			return err
		}
		*dev = d
	}
	return nil
}
