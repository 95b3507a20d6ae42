// Package horovod is Horovod for Go: the collectives of data-parallel training (allreduce,
// allgather, broadcast, reducescatter, alltoall, barrier, join; grouped allreduce, allgather and
// reducescatter; BroadcastObject and AllgatherObject for any gob-encodable value) with Horovod's
// semantics, and the distributed optimizer step (Reducer) that averages a train step's named
// gradients through fused, optionally fp16-compressed allreduces.
//
// A process calls Init once. Under mpirun (or srun, or a PMI mpiexec) it joins the job over MPI,
// whose backend registers itself when the program imports it,
//
//	import _ "github.com/gorovod/gorovod/horovod/mpi"
//
// (package horovod links no MPI of its own); started by hand it is a job of size 1 that needs
// no MPI. Every collective names its tensor; negotiation rounds agree with the other ranks on
// which named operations every rank has submitted, check that they agree on dtype, shape, op and
// root, fuse ready allreduces into buffers of up to HOROVOD_FUSION_THRESHOLD bytes (broadcasts,
// allgathers and reducescatters into batches closed once they reach 256 KiB) and run them on the
// backend. A background loop (one per process, as Horovod's background thread; one more per
// process set) runs the rounds, except that the caller of a blocking operation that finds no
// round in progress runs the round announcing it itself: ranks calling in step then complete
// without a hand-over between goroutines (see LoopStats). Agreement is cached, so a steady
// training loop exchanges a few bits per tensor per step. A disagreement fails the operation
// with the same error on every rank, naming the tensor and the ranks; nothing hangs on it.
//
//	hvd, err := horovod.Init()
//	if err != nil { ... }
//	defer hvd.Shutdown()
//	avg, err := hvd.Allreduce("loss", t, horovod.AllreduceOptions{}) // Average is the default op
//
//	reducer, err := hvd.NewReducer(horovod.ReducerOptions{Compression: horovod.FP16Compression})
//	grads, ready, err := reducer.Reduce(namedGradients)
//
// Process sets (AddProcessSet) run collectives among some of the ranks, on a backend and a
// background loop of their own, beside the job's.
//
// Environment (Horovod's names): HOROVOD_FUSION_THRESHOLD, HOROVOD_CYCLE_TIME, HOROVOD_TIMELINE,
// HOROVOD_STALL_CHECK_TIME_SECONDS, HOROVOD_STALL_SHUTDOWN_TIME_SECONDS, HOROVOD_STALL_CHECK_DISABLE,
// HOROVOD_CACHE_CAPACITY, HOROVOD_DYNAMIC_PROCESS_SETS, and gorovod's GOROVOD_MPI_WAIT; see
// ReadSettings.
package horovod

import (
	"errors"
	"fmt"
	"log"
	"os"
	"sync"

	"github.com/gorovod/gorovod/horovod/backend"
	"github.com/gorovod/gorovod/horovod/internal/parallel"
	"github.com/gorovod/gorovod/horovod/local"
)

// Horovod is an initialized process of a job. Its methods are safe for concurrent use.
type Horovod struct {
	topo     backend.Topology
	cfg      config
	log      *log.Logger
	ctl      *controller
	shutdown sync.Once
	closeErr error
	// hostFallback logs, once, that the data backend could not lend host memory for an arena.
	hostFallback sync.Once
	// results is the memory of new results, recycled through Release; the job's process sets
	// share it with the job.
	results *resultPool

	// sets are the process sets this rank is in (AddProcessSet), shut down before the job.
	setsMu sync.Mutex
	sets   []*Horovod
	// initSets are the process sets of WithProcessSets, nil where this rank is not a member.
	initSets []*Horovod
	// members is, for a process set, its ranks in the job; nil for the job itself.
	members []int

	// workers is how many goroutines one large host-memory pass (fp16 compression, scaling,
	// the fusion buffer's copies) may use: this process's share of the machine's cores.
	workers int
}

// ErrShutdown is returned for operations submitted after Shutdown on any rank.
var ErrShutdown = errors.New("horovod: shut down")

// Init joins the job the launcher started this process in (OpenMPI's mpirun, or Slurm's srun with
// an MPI that speaks PMI) through the registered MPI driver, or makes a job of size 1 when no
// launcher did; under a launcher, a program that imports no MPI driver gets a
// *MissingDriverError. Options override the HOROVOD_* environment. When some ranks fail to set
// up (open the data backend, create the timeline), Init returns a *SetupError naming them on
// every rank and starts nothing.
func Init(opts ...Option) (*Horovod, error) {
	cfg, err := configFromEnv()
	if err != nil {
		return nil, err
	}
	for _, o := range opts {
		o(&cfg)
	}
	control := cfg.control
	if control == nil {
		if control, err = openLauncherBackend(cfg.Settings, cfg.opensProcessSets()); err != nil {
			return nil, err
		}
	}
	shutdownIgnored := cfg.settleStallTimes()
	h := &Horovod{topo: control.Topology(), cfg: cfg, results: &resultPool{}}
	h.workers = parallel.Workers(h.topo.LocalSize)
	h.log = newLogger(cfg.logOutput, h.topo.Rank)
	if shutdownIgnored && h.topo.Rank == 0 {
		h.log.Print(stallShutdownIgnored)
	}
	// The local steps can fail on some ranks only (no GPU here, a timeline path only rank 0 opens).
	// A rank that gave up alone would leave the others waiting for it in their first collective, so
	// the ranks agree on the outcome first, and only a job where every rank is ready starts its loop.
	data, ctl, setupErr := setUp(h, control)
	adopted, err := agreeOnSetup(control, h.topo, setupErr, &h.cfg.Settings, h.cfg.processSets)
	if err != nil {
		if ctl != nil {
			ctl.timeline.close()
		}
		if data != nil && data != control {
			data.Close()
		}
		control.Close()
		return nil, err
	}
	for _, line := range adopted {
		h.log.Print(line)
	}
	if ctl.cache.capacity != h.cfg.CacheCapacity { // rank 0's
		ctl.cache = newResponseCache(h.cfg.CacheCapacity)
	}
	h.ctl = ctl
	ctl.start()
	for i, ranks := range h.cfg.processSets {
		set, err := h.addSet("Init", ranks)
		if err != nil {
			// Adding a set is negotiated: every rank fails alike here, and shuts down with the others.
			return nil, errors.Join(fmt.Errorf("horovod: Init: process set %d of WithProcessSets, ranks %v: %w", i, ranks, err), h.Shutdown())
		}
		h.initSets = append(h.initSets, set)
	}
	return h, nil
}

// setUp does this rank's local part of Init: open the data backend and make the controller.
// It starts nothing: on failure, what it returns besides the error is what there is to close.
func setUp(h *Horovod, control backend.Backend) (backend.Backend, *controller, error) {
	for i, ranks := range h.cfg.processSets {
		if err := checkMembers(ranks, h.topo.Size); err != nil {
			return nil, nil, fmt.Errorf("process set %d of WithProcessSets: %w", i, err)
		}
	}
	data := control
	if h.cfg.data != nil {
		var err error
		if data, err = h.cfg.data(control); err != nil {
			return nil, nil, fmt.Errorf("opening the data backend: %w", err)
		}
	}
	ctl, err := newController(h, control, data)
	return data, ctl, err
}

// The driver a launcher's job is joined with, and the package that registers it.
const (
	mpiDriver = "mpi"
	mpiImport = "github.com/gorovod/gorovod/horovod/mpi"
)

// openLauncherBackend opens the registered MPI driver when a launcher started more than one
// process, and checks that MPI sees the job the launcher describes: an MPI without the
// launcher's support starts every process as a job of its own, which would otherwise train N
// unsynchronized models.
func openLauncherBackend(s Settings, processSets bool) (backend.Backend, error) {
	l, err := DetectLauncher(os.LookupEnv)
	if err != nil {
		return nil, err
	}
	if l.Size <= 1 {
		return local.Backend{}, nil
	}
	open, ok := backend.Lookup(mpiDriver)
	if !ok {
		return nil, &MissingDriverError{Launcher: l, Driver: mpiDriver, Import: mpiImport}
	}
	comm, err := open(backend.DriverConfig{Wait: s.MPIWait, ProcessSets: processSets})
	if err != nil {
		return nil, fmt.Errorf("horovod: %s started %d processes but MPI failed to initialize: %w", l.Name, l.Size, err)
	}
	if t := comm.Topology(); t.Size != l.Size || t.Rank != l.Rank {
		comm.Close()
		return nil, fmt.Errorf("horovod: the %s variables say rank %d of %d but MPI sees rank %d of %d: "+
			"start the processes with mpirun, or with srun and an MPI built with Slurm's PMI support",
			l.Name, l.Rank, l.Size, t.Rank, t.Size)
	}
	return comm, nil
}

// Rank is this process's index in the job, 0..Size()-1.
func (h *Horovod) Rank() int { return h.topo.Rank }

// Size is the number of processes in the job.
func (h *Horovod) Size() int { return h.topo.Size }

// LocalRank is this process's index among the processes on its machine (pick the GPU with it).
func (h *Horovod) LocalRank() int { return h.topo.LocalRank }

// LocalSize is the number of processes on this machine.
func (h *Horovod) LocalSize() int { return h.topo.LocalSize }

// CrossRank is the index of this machine among those running a process of this LocalRank.
func (h *Horovod) CrossRank() int { return h.topo.CrossRank }

// CrossSize is the number of machines running a process of this LocalRank.
func (h *Horovod) CrossSize() int { return h.topo.CrossSize }

// Backend names the engine that moves tensors ("mpi", "local", "nccl").
func (h *Horovod) Backend() string { return h.ctl.data.Name() }

// LoopStats counts how this rank's negotiation rounds were run (see Horovod.LoopStats).
type LoopStats struct {
	// Rounds is how many negotiation rounds this rank has taken part in.
	Rounds uint64
	// CallerRounds is how many of them the caller of a blocking operation (Allreduce, Allgather,
	// Broadcast, the Grouped ones, BroadcastVariables, Barrier, Reducer.Reduce) ran itself, on
	// its own goroutine, having found no round in progress.
	CallerRounds uint64
	// HandOvers is how many blocking operations the background loop completed instead: another
	// rank had not submitted its part by the caller's round, or a round was in progress.
	HandOvers uint64
	// CallerYields is how many times a caller that ran rounds itself then yielded its processor
	// to Go's scheduler: at most once every few milliseconds, so that Go's runtime never takes
	// the processor from a caller in a long run of collectives (see callerYieldInterval).
	CallerYields uint64
}

// LoopStats reports how this rank's negotiation rounds were run so far. In a loop whose ranks
// call the same blocking operations in step, most complete in the round their caller runs, with
// no hand-over between goroutines.
func (h *Horovod) LoopStats() LoopStats {
	c := h.ctl
	return LoopStats{Rounds: c.rounds.Load(), CallerRounds: c.callerRounds.Load(), HandOvers: c.handOvers.Load(), CallerYields: c.callerYields.Load()}
}

// Shutdown stops the background loop on every rank (operations still waiting fail with
// ErrShutdown), writes the timeline and closes the backends. Later calls return the first result.
// The job's Shutdown first shuts down the process sets this rank is in, in the order they were
// added.
func (h *Horovod) Shutdown() error {
	h.shutdown.Do(func() {
		var errs []error
		for _, set := range h.takeSets() {
			if err := set.Shutdown(); err != nil {
				errs = append(errs, fmt.Errorf("process set %v: %w", set.members, err))
			}
		}
		h.closeErr = errors.Join(append(errs, h.ctl.shutdown())...)
	})
	return h.closeErr
}
