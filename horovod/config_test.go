package horovod

import (
	"errors"
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/gorovod/gorovod/horovod/backend"
)

// A bad GOROVOD_MPI_WAIT in a job mpirun started is a configuration error naming the variable,
// found before any driver is looked up or opened, not a failure of MPI to initialize.
func TestBadMPIWaitIsAConfigurationError(t *testing.T) {
	t.Setenv("OMPI_COMM_WORLD_RANK", "0")
	t.Setenv("OMPI_COMM_WORLD_SIZE", "2")
	t.Setenv("GOROVOD_MPI_WAIT", "bogus")
	_, err := Init()
	if err == nil || err.Error() != `horovod: GOROVOD_MPI_WAIT="bogus": want sleep or spin` {
		t.Fatalf("Init with GOROVOD_MPI_WAIT=bogus: %v", err)
	}
}

// A shutdown time shorter than the check time turns the shutdown off, as in Horovod; equal or
// longer, or a zero check time, keeps it.
func TestStallShutdownShorterThanCheckIsOff(t *testing.T) {
	for _, tc := range []struct {
		check, shutdown, want string
		ignored               bool
	}{
		{"60", "0.2", "0s", true},
		{"60", "60", "1m0s", false},
		{"60", "90", "1m30s", false},
		{"0", "5", "5s", false},
		{"60", "0", "0s", false},
	} {
		t.Setenv("HOROVOD_STALL_CHECK_TIME_SECONDS", tc.check)
		t.Setenv("HOROVOD_STALL_SHUTDOWN_TIME_SECONDS", tc.shutdown)
		c, err := configFromEnv()
		if err != nil {
			t.Fatal(err)
		}
		ignored := c.settleStallTimes()
		if ignored != tc.ignored || c.StallShutdown.String() != tc.want {
			t.Errorf("check %s shutdown %s: shutdown %v ignored=%v, want %s ignored=%v", tc.check, tc.shutdown, c.StallShutdown, ignored, tc.want, tc.ignored)
		}
	}
}

// In a job, the ignored shutdown is said once, by rank 0, at Init, and a stall past it warns but
// does not abort.
func TestStallShutdownShorterThanCheckWarnsAndKeepsWaiting(t *testing.T) {
	g := newLoopback(2)
	var logs [2]syncBuffer
	hs, errs := initRanks(g, func(r int) []Option {
		return []Option{WithLogOutput(&logs[r]), WithStallCheck(200*time.Millisecond, 20*time.Millisecond)}
	})
	if err := errors.Join(errs...); err != nil {
		t.Fatal(err)
	}
	for _, h := range hs {
		defer h.Shutdown()
	}
	if !strings.HasSuffix(strings.SplitN(logs[0].String(), "\n", 2)[0], stallShutdownIgnored) {
		t.Errorf("rank 0's first log line is not Horovod's notice:\n%s", logs[0].String())
	}
	if logs[1].String() != "" {
		t.Errorf("rank 1 logged %q", logs[1].String())
	}
	x := mustTensor(t, nil, []float32{1})
	h0, err := hs[0].AllreduceAsync("late", x, AllreduceOptions{})
	if err != nil {
		t.Fatal(err)
	}
	select {
	case r := <-g.aborted:
		t.Fatalf("rank %d aborted with the shutdown off", r)
	case <-time.After(600 * time.Millisecond):
	}
	if _, err := hs[1].Allreduce("late", x, AllreduceOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := h0.Wait(); err != nil {
		t.Fatal(err)
	}
	got := logs[0].String()
	if strings.Count(got, stallShutdownIgnored) != 1 || !strings.Contains(got, "Missing ranks:\n1: [late]\n") {
		t.Errorf("rank 0 logged:\n%s", got)
	}
}

// The stall report groups operations by missing rank in rank order, names at most
// maxStallNames per rank in name order and counts the rest, and marks ranks past the shutdown.
func TestStallReportLayout(t *testing.T) {
	var many []string
	for i := 9; i >= 0; i-- {
		many = append(many, fmt.Sprintf("grad/%d", i))
	}
	got := stallReport(map[int][]string{3: {"b", "a"}, 1: many, 0: {"x"}}, map[int]bool{3: true})
	want := "0: [x]\n" +
		"1: [grad/0, grad/1, grad/2, grad/3, grad/4, grad/5] and 4 more\n" +
		"3!: [a, b]"
	if got != want {
		t.Errorf("stall report:\n%s\nwant:\n%s", got, want)
	}
}

func lookupIn(env map[string]string) func(string) (string, bool) {
	return func(name string) (string, bool) {
		v, ok := env[name]
		return v, ok
	}
}

var defaultSettings = Settings{
	FusionThreshold: 128 << 20,
	CycleTime:       time.Millisecond,
	CacheCapacity:   1024,
	StallCheck:      time.Minute,
}

// Each variable read in its unit (bytes, milliseconds, seconds), unset ones at Horovod's defaults.
func TestReadSettings(t *testing.T) {
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
		// Horovod's "started later by hvd.start_timeline": none until then, not a file named DYNAMIC.
		{map[string]string{"HOROVOD_TIMELINE": "DYNAMIC"}, func(*Settings) {}},
		{map[string]string{"HOROVOD_STALL_CHECK_TIME_SECONDS": "0.25", "HOROVOD_STALL_SHUTDOWN_TIME_SECONDS": "120"},
			func(s *Settings) { s.StallCheck, s.StallShutdown = 250*time.Millisecond, 2*time.Minute }},
		{map[string]string{"GOROVOD_MPI_WAIT": "spin"}, func(s *Settings) { s.MPIWait = backend.WaitSpin }},
		{map[string]string{"GOROVOD_MPI_WAIT": "sleep"}, func(*Settings) {}},
		// Unrelated variables are not read.
		{map[string]string{"HOROVOD_AUTOTUNE": "x", "NCCL_DEBUG": "INFO"}, func(*Settings) {}},
	} {
		want := defaultSettings
		tc.want(&want)
		got, err := ReadSettings(lookupIn(tc.env))
		if err != nil || got != want {
			t.Errorf("%v: %+v, %v; want %+v", tc.env, got, err, want)
		}
	}
}

// A malformed value is refused with a message naming the variable and the value; the first bad
// variable in Settings' order is the one named.
func TestReadSettingsRefuses(t *testing.T) {
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
		if _, err := ReadSettings(lookupIn(tc.env)); err == nil || err.Error() != tc.want {
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
		s, err := ReadSettings(lookupIn(map[string]string{
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

func TestReadsVariable(t *testing.T) {
	for name, want := range map[string]bool{
		"HOROVOD_FUSION_THRESHOLD": true, "HOROVOD_TIMELINE": true, "HOROVOD_STALL_CHECK_DISABLE": true,
		"HOROVOD_AUTOTUNE": false, "GOROVOD_MPI_WAIT": false, "HOROVOD_": false,
	} {
		if ReadsVariable(name) != want {
			t.Errorf("ReadsVariable(%q) = %v", name, !want)
		}
	}
}

// HOROVOD_DYNAMIC_PROCESS_SETS allows process sets when it is a positive integer, as Horovod's
// switch; a value that is not an integer is an error naming the variable.
func TestDynamicProcessSetsVariable(t *testing.T) {
	for value, want := range map[string]bool{"1": true, " 3": true, "0": false, "": false, "-1": false} {
		s, err := ReadSettings(lookupIn(map[string]string{"HOROVOD_DYNAMIC_PROCESS_SETS": value}))
		if err != nil || s.DynamicProcessSets != want {
			t.Errorf("HOROVOD_DYNAMIC_PROCESS_SETS=%q: %v, %v; want %v", value, s.DynamicProcessSets, err, want)
		}
	}
	_, err := ReadSettings(lookupIn(map[string]string{"HOROVOD_DYNAMIC_PROCESS_SETS": "true"}))
	if want := `horovod: HOROVOD_DYNAMIC_PROCESS_SETS="true": want an integer (Horovod allows process sets to be added when it is positive, so 1; true or false are not read as such)`; err == nil || err.Error() != want {
		t.Errorf("HOROVOD_DYNAMIC_PROCESS_SETS=true: %v, want %s", err, want)
	}
	if !ReadsVariable("HOROVOD_DYNAMIC_PROCESS_SETS") {
		t.Error("ReadsVariable(HOROVOD_DYNAMIC_PROCESS_SETS) = false")
	}
}
