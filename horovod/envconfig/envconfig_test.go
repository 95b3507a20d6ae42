package envconfig

import (
	"strconv"
	"testing"
	"time"
)

func lookupIn(env map[string]string) func(string) (string, bool) {
	return func(name string) (string, bool) {
		v, ok := env[name]
		return v, ok
	}
}

var defaults = Settings{
	FusionThreshold: 128 << 20,
	CycleTime:       time.Millisecond,
	CacheCapacity:   1024,
	StallCheck:      time.Minute,
}

// Each variable read in its unit (bytes, milliseconds, seconds), unset ones at Horovod's defaults.
func TestRead(t *testing.T) {
	for _, tc := range []struct {
		env  map[string]string
		want func(*Settings)
	}{
		{nil, func(*Settings) {}},
		{map[string]string{"HOROVOD_FUSION_THRESHOLD": "0"}, func(s *Settings) { s.FusionThreshold = 0 }},
		{map[string]string{"HOROVOD_FUSION_THRESHOLD": "67108864"}, func(s *Settings) { s.FusionThreshold = 64 << 20 }},
		{map[string]string{"HOROVOD_CYCLE_TIME": "3.5"}, func(s *Settings) { s.CycleTime = 3500 * time.Microsecond }},
		{map[string]string{"HOROVOD_CACHE_CAPACITY": "0"}, func(s *Settings) { s.CacheCapacity = 0 }},
		{map[string]string{"HOROVOD_TIMELINE": "/t/tl.json"}, func(s *Settings) { s.Timeline = "/t/tl.json" }},
		{map[string]string{"HOROVOD_STALL_CHECK_TIME_SECONDS": "0.25", "HOROVOD_STALL_SHUTDOWN_TIME_SECONDS": "120"},
			func(s *Settings) { s.StallCheck, s.StallShutdown = 250*time.Millisecond, 2*time.Minute }},
		{map[string]string{"GOROVOD_MPI_WAIT": "spin"}, func(*Settings) {}},
		// Unrelated variables are not read.
		{map[string]string{"HOROVOD_AUTOTUNE": "x", "NCCL_DEBUG": "INFO"}, func(*Settings) {}},
	} {
		want := defaults
		tc.want(&want)
		got, err := Read(lookupIn(tc.env))
		if err != nil || got != want {
			t.Errorf("%v: %+v, %v; want %+v", tc.env, got, err, want)
		}
	}
}

// A malformed value is refused with a message naming the variable and the value; the first bad
// variable in Settings' order is the one named.
func TestReadRefuses(t *testing.T) {
	for _, tc := range []struct {
		env  map[string]string
		want string
	}{
		{map[string]string{"HOROVOD_FUSION_THRESHOLD": "64MB"}, `horovod: HOROVOD_FUSION_THRESHOLD="64MB": want a non-negative integer`},
		{map[string]string{"HOROVOD_FUSION_THRESHOLD": "-1"}, `horovod: HOROVOD_FUSION_THRESHOLD="-1": want a non-negative integer`},
		{map[string]string{"HOROVOD_CACHE_CAPACITY": "1.5"}, `horovod: HOROVOD_CACHE_CAPACITY="1.5": want a non-negative integer`},
		{map[string]string{"HOROVOD_CYCLE_TIME": "abc"}, `horovod: HOROVOD_CYCLE_TIME="abc": want a non-negative number`},
		{map[string]string{"HOROVOD_CYCLE_TIME": ""}, `horovod: HOROVOD_CYCLE_TIME="": want a non-negative number`},
		{map[string]string{"HOROVOD_CYCLE_TIME": "NaN"}, `horovod: HOROVOD_CYCLE_TIME="NaN": want a non-negative number`},
		{map[string]string{"HOROVOD_STALL_CHECK_TIME_SECONDS": "-5"}, `horovod: HOROVOD_STALL_CHECK_TIME_SECONDS="-5": want a non-negative number`},
		{map[string]string{"HOROVOD_STALL_SHUTDOWN_TIME_SECONDS": "Inf"}, `horovod: HOROVOD_STALL_SHUTDOWN_TIME_SECONDS="Inf": want a non-negative number`},
		{map[string]string{"HOROVOD_STALL_SHUTDOWN_TIME_SECONDS": "1e10"}, `horovod: HOROVOD_STALL_SHUTDOWN_TIME_SECONDS="1e10": want a non-negative number`},
		{map[string]string{"GOROVOD_MPI_WAIT": "bogus"}, `horovod: GOROVOD_MPI_WAIT="bogus": want sleep or spin`},
		{map[string]string{"HOROVOD_CACHE_CAPACITY": "x", "HOROVOD_FUSION_THRESHOLD": "y", "GOROVOD_MPI_WAIT": "z"},
			`horovod: HOROVOD_FUSION_THRESHOLD="y": want a non-negative integer`},
	} {
		if _, err := Read(lookupIn(tc.env)); err == nil || err.Error() != tc.want {
			t.Errorf("%v: err = %v, want %s", tc.env, err, tc.want)
		}
	}
}

// HOROVOD_STALL_CHECK_DISABLE disables the check when it is a positive integer, as Horovod's
// strtol(value) > 0; a value that is not an integer is an error naming the variable, where
// Horovod would read "true" as 0 and silently keep the check on.
func TestStallCheckDisable(t *testing.T) {
	for _, tc := range []struct {
		value    string
		disabled bool
		err      bool
	}{
		{"1", true, false},
		{"2", true, false},
		{" 1", true, false},
		{"0", false, false},
		{"-1", false, false},
		{"", false, false},
		{"false", false, true},
		{"true", false, true},
		{"1abc", false, true},
	} {
		s, err := Read(lookupIn(map[string]string{
			"HOROVOD_STALL_CHECK_DISABLE":         tc.value,
			"HOROVOD_STALL_SHUTDOWN_TIME_SECONDS": "120",
		}))
		if tc.err {
			want := "horovod: HOROVOD_STALL_CHECK_DISABLE=" + strconv.Quote(tc.value) + ": want an integer (Horovod disables the stall check when it is positive, so 1; true or false are not read as such)"
			if err == nil || err.Error() != want {
				t.Errorf("HOROVOD_STALL_CHECK_DISABLE=%q: err = %v, want %s", tc.value, err, want)
			}
			continue
		}
		if err != nil {
			t.Errorf("HOROVOD_STALL_CHECK_DISABLE=%q: %v", tc.value, err)
			continue
		}
		want := [2]time.Duration{DefaultStallCheckTime, 120 * time.Second}
		if tc.disabled {
			want = [2]time.Duration{}
		}
		if got := [2]time.Duration{s.StallCheck, s.StallShutdown}; got != want {
			t.Errorf("HOROVOD_STALL_CHECK_DISABLE=%q: check, shutdown = %v, want %v", tc.value, got, want)
		}
	}
}

func TestReads(t *testing.T) {
	for name, want := range map[string]bool{
		"HOROVOD_FUSION_THRESHOLD": true, "HOROVOD_TIMELINE": true, "HOROVOD_STALL_CHECK_DISABLE": true,
		"HOROVOD_AUTOTUNE": false, "GOROVOD_MPI_WAIT": false, "HOROVOD_": false,
	} {
		if Reads(name) != want {
			t.Errorf("Reads(%q) = %v", name, !want)
		}
	}
}
