// Package envconfig reads the environment variables horovod's Init runs with (HOROVOD_FUSION_THRESHOLD,
// HOROVOD_CYCLE_TIME, ..., and GOROVOD_MPI_WAIT). It is pure Go without cgo and apart from
// package horovod, which links MPI: the launcher (gorovodrun) refuses with the same parser, and
// the same message, a value every rank's Init would refuse, before it starts any rank.
package envconfig

import (
	"fmt"
	"math"
	"strconv"
	"strings"
	"time"

	"github.com/gorovod/gorovod/horovod/mpi/mpiwait"
)

// Defaults, as in Horovod.
const (
	DefaultFusionThreshold = 128 << 20
	DefaultCycleTime       = time.Millisecond
	DefaultStallCheckTime  = 60 * time.Second
	DefaultCacheCapacity   = 1024
)

// The HOROVOD_* variables Read reads.
const (
	FusionThreshold   = "HOROVOD_FUSION_THRESHOLD"
	CycleTime         = "HOROVOD_CYCLE_TIME"
	CacheCapacity     = "HOROVOD_CACHE_CAPACITY"
	Timeline          = "HOROVOD_TIMELINE"
	StallCheckDisable = "HOROVOD_STALL_CHECK_DISABLE"
	StallCheckTime    = "HOROVOD_STALL_CHECK_TIME_SECONDS"
	StallShutdownTime = "HOROVOD_STALL_SHUTDOWN_TIME_SECONDS"
)

var horovodVariables = map[string]bool{
	FusionThreshold: true, CycleTime: true, CacheCapacity: true, Timeline: true,
	StallCheckDisable: true, StallCheckTime: true, StallShutdownTime: true,
}

// Reads reports whether name is one of the HOROVOD_* variables Read reads; Horovod has others
// (HOROVOD_AUTOTUNE, ...) that gorovod does not act on.
func Reads(name string) bool { return horovodVariables[name] }

// Settings are the values of the variables, or their defaults where unset.
type Settings struct {
	FusionThreshold int           // bytes; 0 disables fusion
	CycleTime       time.Duration // longest wait before an idle negotiation round
	CacheCapacity   int           // agreed signatures remembered; 0 disables the cache
	Timeline        string        // Chrome trace path written by rank 0; "" for none
	StallCheck      time.Duration // 0 disables the stall warning
	StallShutdown   time.Duration // 0 never aborts
}

// Read reads the variables through lookup (os.LookupEnv, or the environment a launcher gives
// its ranks). A malformed value is an error naming the variable and the value; with several,
// the first in the order of Settings' fields. Read checks GOROVOD_MPI_WAIT too (package
// mpiwait): the MPI backend reads it itself when it opens, but a bad value is the configuration
// error it is, refused before MPI starts rather than as a failure to initialize MPI.
func Read(lookup func(string) (string, bool)) (Settings, error) {
	s := Settings{
		FusionThreshold: DefaultFusionThreshold,
		CycleTime:       DefaultCycleTime,
		CacheCapacity:   DefaultCacheCapacity,
		StallCheck:      DefaultStallCheckTime,
	}
	s.Timeline, _ = lookup(Timeline)
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
	intVar(FusionThreshold, &s.FusionThreshold)
	durVar(CycleTime, time.Millisecond, &s.CycleTime)
	intVar(CacheCapacity, &s.CacheCapacity)
	durVar(StallCheckTime, time.Second, &s.StallCheck)
	durVar(StallShutdownTime, time.Second, &s.StallShutdown)
	// Horovod disables the check when strtol reads a positive integer. A value it would read as
	// 0 without being a number ("true", "false", "yes") is refused here rather than silently
	// keeping the check on as Horovod does: whoever wrote "true" meant to disable it.
	if v, ok := lookup(StallCheckDisable); ok && v != "" && err == nil {
		n, e := strconv.ParseInt(strings.TrimSpace(v), 10, 64)
		if e != nil {
			err = fmt.Errorf("horovod: %s=%q: want an integer (Horovod disables the stall check when it is positive, so 1; true or false are not read as such)", StallCheckDisable, v)
		} else if n > 0 {
			s.StallCheck, s.StallShutdown = 0, 0
		}
	}
	if err != nil {
		return Settings{}, err
	}
	wait, _ := lookup(mpiwait.Env)
	if _, err := mpiwait.Sleeping(wait); err != nil {
		return Settings{}, fmt.Errorf("horovod: %w", err)
	}
	return s, nil
}
