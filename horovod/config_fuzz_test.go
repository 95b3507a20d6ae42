package horovod

import (
	"strconv"
	"strings"
	"testing"

	"github.com/gorovod/gorovod/horovod/backend"
)

// FuzzReadSettings: any values of the variables give settings no negative count or duration
// (a disabled stall check disables both times), or an error quoting a variable with its value.
func FuzzReadSettings(f *testing.F) {
	f.Add("67108864", "5", "0", "60", "120", "", "spin", "1")
	f.Add("-1", "0.5", "1024", "1e300", "NaN", "1", "", "yes")
	f.Add("9223372036854775807", "Inf", "x", "-0", "9223372036.854775807", " 2 ", "sleep", "")
	f.Fuzz(func(t *testing.T, fusion, cycle, cache, stallCheck, stallShutdown, disable, wait, sets string) {
		env := map[string]string{
			envFusionThreshold: fusion, envCycleTime: cycle, envCacheCapacity: cache, envStallCheckTime: stallCheck,
			envStallShutdownTime: stallShutdown, envStallCheckDisable: disable, envMPIWait: wait,
			envDynamicProcessSets: sets,
		}
		s, err := ReadSettings(func(name string) (string, bool) { v, ok := env[name]; return v, ok })
		if err != nil {
			for name, v := range env {
				if strings.Contains(err.Error(), name+"="+strconv.Quote(v)) {
					return
				}
			}
			t.Fatalf("%q: the error names no variable with its value: %v", env, err)
		}
		if s.FusionThreshold < 0 || s.CycleTime < 0 || s.CacheCapacity < 0 || s.StallCheck < 0 || s.StallShutdown < 0 ||
			(s.MPIWait != backend.WaitSleep && s.MPIWait != backend.WaitSpin) {
			t.Fatalf("%q: read as %+v", env, s)
		}
		if n, err := strconv.Atoi(strings.TrimSpace(disable)); err == nil && n > 0 && (s.StallCheck != 0 || s.StallShutdown != 0) {
			t.Fatalf("%q: the stall check is on: %+v", env, s)
		}
		if n, err := strconv.Atoi(strings.TrimSpace(sets)); s.DynamicProcessSets != (err == nil && n > 0) {
			t.Fatalf("%q: process sets %v", env, s.DynamicProcessSets)
		}
	})
}

// FuzzDetectLauncher: a launcher's rank and size variables give a rank within a size, or an error
// quoting both.
func FuzzDetectLauncher(f *testing.F) {
	f.Add("0", "2")
	f.Add("2", "2")
	f.Add("-1", "1")
	f.Add("1", "+3")
	f.Fuzz(func(t *testing.T, rank, size string) {
		env := map[string]string{"OMPI_COMM_WORLD_RANK": rank, "OMPI_COMM_WORLD_SIZE": size}
		l, err := DetectLauncher(func(name string) (string, bool) { v, ok := env[name]; return v, ok })
		if err != nil {
			if !strings.Contains(err.Error(), "OMPI_COMM_WORLD_RANK="+strconv.Quote(rank)) || !strings.Contains(err.Error(), "OMPI_COMM_WORLD_SIZE="+strconv.Quote(size)) {
				t.Fatalf("rank %q of %q: the error does not quote them: %v", rank, size, err)
			}
			return
		}
		if l.Name != "mpirun" || l.Rank < 0 || l.Rank >= l.Size {
			t.Fatalf("rank %q of %q: %+v", rank, size, l)
		}
	})
}
