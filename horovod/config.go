package horovod

import (
	"fmt"
	"io"
	"log"
	"math"
	"os"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/gorovod/gorovod/horovod/backend"
)

// Defaults, as in Horovod.
const (
	DefaultFusionThreshold = 128 << 20
	DefaultCycleTime       = time.Millisecond
	DefaultStallCheckTime  = 60 * time.Second
	DefaultCacheCapacity   = 1024
)

// The variables ReadSettings reads: Horovod's, then gorovod's own.
const (
	envFusionThreshold   = "HOROVOD_FUSION_THRESHOLD"
	envCycleTime         = "HOROVOD_CYCLE_TIME"
	envCacheCapacity     = "HOROVOD_CACHE_CAPACITY"
	envTimeline          = "HOROVOD_TIMELINE"
	envStallCheckDisable = "HOROVOD_STALL_CHECK_DISABLE"
	envStallCheckTime    = "HOROVOD_STALL_CHECK_TIME_SECONDS"
	envStallShutdownTime = "HOROVOD_STALL_SHUTDOWN_TIME_SECONDS"
	// envDynamicProcessSets lets a job add process sets after Init (AddProcessSet), as Horovod's
	// does: a positive integer turns it on.
	envDynamicProcessSets = "HOROVOD_DYNAMIC_PROCESS_SETS"

	// envMPIWait says how a rank waits in an allgather whose parts are all small (horovod's
	// negotiation rounds), where the rank that arrives first waits for the slowest peer's train
	// step to end: "sleep" (the default) tests the collective for 50 µs without pause, then sleeps
	// between tests, 10 µs doubling to 0.5 ms, leaving the core to the peers' computation; "spin"
	// is MPI's blocking call, which polls until the last peer arrives (for dedicated cores, or
	// with mpirun's mpi_yield_when_idle). Every other collective is MPI's blocking call: horovod
	// issues them once negotiation has established that every rank is there.
	envMPIWait = "GOROVOD_MPI_WAIT"

	// dynamicTimeline is HOROVOD_TIMELINE's value for a timeline started later by a call
	// (Horovod's hvd.start_timeline; StartTimeline here).
	dynamicTimeline = "DYNAMIC"
)

var horovodVariables = map[string]bool{
	envFusionThreshold: true, envCycleTime: true, envCacheCapacity: true, envTimeline: true,
	envStallCheckDisable: true, envStallCheckTime: true, envStallShutdownTime: true,
	envDynamicProcessSets: true,
}

// ReadsVariable reports whether name is one of the HOROVOD_* variables ReadSettings reads;
// Horovod has others (HOROVOD_AUTOTUNE, ...) that gorovod does not act on.
func ReadsVariable(name string) bool { return horovodVariables[name] }

// Settings are horovod's environment (Horovod's HOROVOD_* variables and GOROVOD_MPI_WAIT), or
// their defaults where unset.
type Settings struct {
	FusionThreshold int           // bytes; 0 disables fusion
	CycleTime       time.Duration // longest wait before an idle negotiation round
	CacheCapacity   int           // agreed signatures remembered; 0 disables the cache
	Timeline        string        // Chrome trace path written by rank 0; "" for none
	StallCheck      time.Duration // 0 disables the stall warning
	StallShutdown   time.Duration // 0 never aborts
	MPIWait         backend.Wait  // how a rank early in a negotiation round waits (GOROVOD_MPI_WAIT)
	// DynamicProcessSets lets the job add process sets (HOROVOD_DYNAMIC_PROCESS_SETS): MPI then
	// runs with MPI_THREAD_MULTIPLE, since every set's negotiation runs on a goroutine of its own.
	DynamicProcessSets bool
}

// ReadSettings reads the variables through lookup (os.LookupEnv, or the environment a launcher
// gives its ranks: gorovodrun refuses with it, before it starts any rank, a value every rank's
// Init would refuse). A malformed value is an error naming the variable and the value; with
// several, the first in the order of Settings' fields.
func ReadSettings(lookup func(string) (string, bool)) (Settings, error) {
	s := Settings{
		FusionThreshold: DefaultFusionThreshold,
		CycleTime:       DefaultCycleTime,
		CacheCapacity:   DefaultCacheCapacity,
		StallCheck:      DefaultStallCheckTime,
	}
	s.Timeline, _ = lookup(envTimeline)
	if s.Timeline == dynamicTimeline {
		// Horovod's value for a timeline that hvd.start_timeline (StartTimeline) starts later;
		// until then none is written, rather than a file named DYNAMIC.
		s.Timeline = ""
	}
	var err error
	intVar := func(name string, dst *int) {
		if v, ok := lookup(name); ok && err == nil {
			n, e := strconv.Atoi(v)
			if e != nil || n < 0 {
				err = fmt.Errorf("horovod: %s=%q: want a non-negative integer", name, v)
				return
			}
			*dst = n
		}
	}
	durVar := func(name string, unit time.Duration, dst *time.Duration) {
		if v, ok := lookup(name); ok && err == nil {
			f, e := strconv.ParseFloat(v, 64)
			// !(f >= 0) refuses NaN too; a duration past time.Duration's range (Inf) as well.
			if e != nil || !(f >= 0) || f*float64(unit) >= math.MaxInt64 {
				err = fmt.Errorf("horovod: %s=%q: want a non-negative number", name, v)
				return
			}
			*dst = time.Duration(f * float64(unit))
		}
	}
	intVar(envFusionThreshold, &s.FusionThreshold)
	durVar(envCycleTime, time.Millisecond, &s.CycleTime)
	intVar(envCacheCapacity, &s.CacheCapacity)
	durVar(envStallCheckTime, time.Second, &s.StallCheck)
	durVar(envStallShutdownTime, time.Second, &s.StallShutdown)
	// Horovod reads both switches with strtol, on when positive. A value it would read as 0
	// without being a number ("true", "false", "yes") is refused here rather than silently
	// read as off, as Horovod does: whoever wrote "true" meant on.
	boolVar := func(name, what string) (on bool) {
		if v, ok := lookup(name); ok && v != "" && err == nil {
			n, e := strconv.ParseInt(strings.TrimSpace(v), 10, 64)
			if e != nil {
				err = fmt.Errorf("horovod: %s=%q: want an integer (Horovod %s when it is positive, so 1; true or false are not read as such)", name, v, what)
			}
			return n > 0
		}
		return false
	}
	if boolVar(envStallCheckDisable, "disables the stall check") {
		s.StallCheck, s.StallShutdown = 0, 0
	}
	s.DynamicProcessSets = boolVar(envDynamicProcessSets, "allows process sets to be added")
	if v, _ := lookup(envMPIWait); err == nil {
		switch v {
		case "", "sleep":
			s.MPIWait = backend.WaitSleep
		case "spin":
			s.MPIWait = backend.WaitSpin
		default:
			err = fmt.Errorf("horovod: %s=%q: want sleep or spin", envMPIWait, v)
		}
	}
	if err != nil {
		return Settings{}, err
	}
	return s, nil
}

// config is what Init runs with: the environment's Settings, then Options on top.
type config struct {
	Settings
	logOutput io.Writer

	control backend.Backend // nil: chosen from the launcher
	data    backend.Opener  // nil: collectives go over the control backend
	// processSets are the process sets Init adds (WithProcessSets), in order.
	processSets [][]int
}

// opensProcessSets tells whether the job's backend must be opened for process sets: added after
// Init, or at Init.
func (c *config) opensProcessSets() bool { return c.DynamicProcessSets || len(c.processSets) > 0 }

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

// WithDynamicProcessSets lets the job add process sets with AddProcessSet
// (HOROVOD_DYNAMIC_PROCESS_SETS=1; Horovod's hvd.init(process_sets="dynamic")).
func WithDynamicProcessSets() Option { return func(c *config) { c.DynamicProcessSets = true } }

// WithProcessSets has Init add process sets of these ranks, in this order, as it starts the job
// (Horovod's hvd.init(process_sets=[...]), its static process sets): every rank gives the same
// sets in the same order, each as AddProcessSet takes its ranks, and ProcessSets returns them.
// MPI then runs with MPI_THREAD_MULTIPLE; adding sets after Init still needs
// WithDynamicProcessSets, as in Horovod.
func WithProcessSets(sets ...[]int) Option {
	return func(c *config) {
		for _, s := range sets {
			c.processSets = append(c.processSets, slices.Clone(s))
		}
	}
}

// WithLogOutput sends horovod's warnings somewhere other than standard error.
func WithLogOutput(w io.Writer) Option { return func(c *config) { c.logOutput = w } }

// WithBackend runs over b instead of the backend the launcher implies (a registered driver, or
// local). horovod takes ownership and closes it at Shutdown.
func WithBackend(b backend.Backend) Option { return func(c *config) { c.control = b } }

// WithDataBackend moves tensor collectives onto the backend open returns (NCCL, for one), while
// negotiation stays on the control backend. open receives the control backend.
func WithDataBackend(open backend.Opener) Option { return func(c *config) { c.data = open } }

// configFromEnv reads the process's environment with ReadSettings.
func configFromEnv() (config, error) {
	s, err := ReadSettings(os.LookupEnv)
	if err != nil {
		return config{}, err
	}
	return config{Settings: s, logOutput: os.Stderr}, nil
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
