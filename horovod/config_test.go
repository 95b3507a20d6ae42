package horovod

import (
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"
)

// A bad GOROVOD_MPI_WAIT in a job mpirun started is a configuration error naming the variable,
// found before MPI opens, not a failure of MPI to initialize.
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
