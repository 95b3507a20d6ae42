package horovod

import (
	"fmt"
	"io"
	"log"
	"os"
	"strconv"
	"time"

	"github.com/gorovod/gorovod/horovod/backend"
	"github.com/gorovod/gorovod/horovod/envconfig"
)

// Defaults, as in Horovod.
const (
	DefaultFusionThreshold = envconfig.DefaultFusionThreshold
	DefaultCycleTime       = envconfig.DefaultCycleTime
	DefaultStallCheckTime  = envconfig.DefaultStallCheckTime
	DefaultCacheCapacity   = envconfig.DefaultCacheCapacity
)

// config is what Init runs with: the HOROVOD_* environment, then Options on top.
type config struct {
	envconfig.Settings
	logOutput io.Writer

	control backend.Backend // nil: chosen from the launcher
	data    backend.Opener  // nil: collectives go over the control backend
}

// Option changes one setting of Init over its environment default.
type Option func(*config)

// WithFusionThreshold sets the fusion buffer size in bytes (HOROVOD_FUSION_THRESHOLD); 0 turns
// fusion off.
func WithFusionThreshold(bytes int) Option { return func(c *config) { c.FusionThreshold = bytes } }

// WithCycleTime sets how long the background loop waits for work before an idle negotiation
// round (HOROVOD_CYCLE_TIME, in milliseconds there).
func WithCycleTime(d time.Duration) Option { return func(c *config) { c.CycleTime = d } }

// WithTimeline makes rank 0 write a Chrome trace to path (HOROVOD_TIMELINE).
func WithTimeline(path string) Option { return func(c *config) { c.Timeline = path } }

// WithStallCheck sets the stall warning time (HOROVOD_STALL_CHECK_TIME_SECONDS) and the abort time
// (HOROVOD_STALL_SHUTDOWN_TIME_SECONDS); 0 disables either. A shutdown time shorter than the
// warning time never aborts, as in Horovod: Init says so in the log of rank 0.
func WithStallCheck(warn, shutdown time.Duration) Option {
	return func(c *config) { c.StallCheck, c.StallShutdown = warn, shutdown }
}

// WithLogOutput sends horovod's warnings somewhere other than standard error.
func WithLogOutput(w io.Writer) Option { return func(c *config) { c.logOutput = w } }

// WithBackend runs over b instead of the backend the launcher implies (MPI or local). horovod
// takes ownership and closes it at Shutdown.
func WithBackend(b backend.Backend) Option { return func(c *config) { c.control = b } }

// WithDataBackend moves tensor collectives onto the backend open returns (NCCL, for one), while
// negotiation stays on the control backend. open receives the control backend.
func WithDataBackend(open backend.Opener) Option { return func(c *config) { c.data = open } }

// configFromEnv reads the HOROVOD_* variables (and GOROVOD_MPI_WAIT) with package envconfig,
// the parser gorovodrun checks them with before it launches; a malformed value is an error
// naming the variable.
func configFromEnv() (config, error) {
	s, err := envconfig.Read(os.LookupEnv)
	if err != nil {
		return config{}, err
	}
	return config{Settings: s, logOutput: os.Stderr}, nil
}

// launcher describes the process manager that started this process, if any.
type launcher struct {
	name       string // "mpirun", "srun", or "" when the process was started by hand
	rank, size int
}

// detectLauncher reads OpenMPI's and Slurm's variables. OpenMPI's win: srun can start an mpirun.
func detectLauncher() (launcher, error) {
	read := func(name, rankVar, sizeVar string) (launcher, bool, error) {
		rs, ok1 := os.LookupEnv(rankVar)
		ss, ok2 := os.LookupEnv(sizeVar)
		if !ok1 || !ok2 {
			return launcher{}, false, nil
		}
		r, e1 := strconv.Atoi(rs)
		s, e2 := strconv.Atoi(ss)
		if e1 != nil || e2 != nil || s < 1 || r < 0 || r >= s {
			return launcher{}, true, fmt.Errorf("horovod: %s=%q %s=%q: not a rank within a size", rankVar, rs, sizeVar, ss)
		}
		return launcher{name: name, rank: r, size: s}, true, nil
	}
	if l, ok, err := read("mpirun", "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE"); ok {
		return l, err
	}
	if l, ok, err := read("srun", "SLURM_PROCID", "SLURM_NTASKS"); ok {
		return l, err
	}
	return launcher{}, nil
}

func newLogger(w io.Writer, rank int) *log.Logger {
	return log.New(w, fmt.Sprintf("horovod[%d]: ", rank), log.LstdFlags|log.Lmsgprefix)
}

// stallShutdownIgnored is logged by Init on rank 0 when the shutdown time is shorter than the
// warning time: Horovod's words, and its behaviour (no shutdown at all).
const stallShutdownIgnored = "HOROVOD_STALL_SHUTDOWN_TIME_SECONDS is less than HOROVOD_STALL_CHECK_TIME_SECONDS, will not shutdown."

// settleStallTimes applies Horovod's rule that a stall shutdown time shorter than the warning time
// turns the shutdown off. It reports whether it did.
func (c *config) settleStallTimes() bool {
	if c.StallShutdown > 0 && c.StallShutdown < c.StallCheck {
		c.StallShutdown = 0
		return true
	}
	return false
}
