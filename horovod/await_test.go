package horovod

import (
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"
)

// Ranks that call the same blocking operations in step complete most of them in the round their
// caller runs, with no hand-over to the background loop; the results are the same as through it.
func TestBlockingCallsRunTheirOwnRound(t *testing.T) {
	hs, _ := job(t, 2)
	const calls = 200
	onEveryRank(t, hs, func(h *Horovod) error {
		out := make([]byte, 4*3)
		for i := range calls {
			x := mustTensor(t, []int{3}, []float32{float32(i), float32(h.Rank()), 1})
			got, err := h.Allreduce("x", x, AllreduceOptions{Op: Sum, Output: out})
			if err != nil {
				return err
			}
			if v, want := mustValues[float32](got), []float32{float32(2 * i), 1, 2}; !slices.Equal(v, want) {
				return fmt.Errorf("call %d: got %v, want %v", i, v, want)
			}
		}
		return nil
	})
	for r, h := range hs {
		s := h.LoopStats()
		// Each call either completes in its caller's round or is handed over; a round that a
		// timer started on the other rank can meet a caller's, so not every call completes in it.
		if s.CallerRounds < calls/2 || s.CallerRounds+s.HandOvers < calls || s.Rounds < s.CallerRounds {
			t.Errorf("rank %d: %+v after %d blocking allreduces in step: want most run by their caller", r, s, calls)
		}
	}
}

// A blocking call whose rank is ahead of the others hands its operation to the background loop,
// which completes it once the others submit.
func TestBlockingCallAheadOfItsPeersIsHandedOver(t *testing.T) {
	hs, _ := job(t, 2)
	done := make(chan error, 1)
	go func() {
		_, err := hs[0].Allreduce("early", mustTensor(t, nil, []float32{1}), AllreduceOptions{Op: Sum})
		done <- err
	}()
	deadline := time.Now().Add(5 * time.Second)
	for hs[0].LoopStats().HandOvers == 0 && time.Now().Before(deadline) {
		time.Sleep(time.Millisecond)
	}
	select {
	case err := <-done:
		t.Fatalf("rank 0's allreduce completed before rank 1 submitted: %v", err)
	default:
	}
	got, err := hs[1].Allreduce("early", mustTensor(t, nil, []float32{2}), AllreduceOptions{Op: Sum})
	if err != nil {
		t.Fatal(err)
	}
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if v := mustValues[float32](got); v[0] != 3 {
		t.Fatalf("got %v, want 3", v)
	}
	if s := hs[0].LoopStats(); s.HandOvers == 0 {
		t.Errorf("rank 0: %+v: want its early call handed over", s)
	}
}

// A round run by a caller that learns of another rank's Shutdown ends this rank's loop too: its
// own Shutdown returns, and later calls fail.
func TestCallerRoundThatSeesShutdownEndsTheLoop(t *testing.T) {
	hs, _ := job(t, 2)
	errc := make(chan error, 1)
	go func() { errc <- hs[0].Shutdown() }()
	var err error
	for err == nil {
		_, err = hs[1].Allreduce("x", mustTensor(t, nil, []float32{1}), AllreduceOptions{})
	}
	if !errors.Is(err, ErrShutdown) || !strings.Contains(err.Error(), "rank 0") {
		t.Fatalf("rank 1's blocking allreduce after rank 0's Shutdown: %v", err)
	}
	if err := <-errc; err != nil {
		t.Fatal(err)
	}
	stopped := make(chan error, 1)
	go func() { stopped <- hs[1].Shutdown() }()
	select {
	case <-stopped:
	case <-time.After(10 * time.Second):
		t.Fatal("rank 1's Shutdown did not return after its caller's round saw rank 0's")
	}
}

// A caller that runs rounds itself passes through Go's scheduler now and then, never after every
// round: often enough that Go's runtime never takes its processor for running too long (a run of
// blocking calls in step may never block), rarely enough that its hand-offs between threads cost
// nothing (callerYieldInterval says why both matter).
func TestCallerRunningRoundsYieldsEveryFewMilliseconds(t *testing.T) {
	hs, _ := job(t, 2)
	start := time.Now()
	deadline := start.Add(10 * time.Second)
	onEveryRank(t, hs, func(h *Horovod) error {
		out := make([]byte, 4)
		for {
			// Every rank makes the same number of calls: each stops once both have seen enough.
			done := hs[0].LoopStats().CallerYields >= 3 && hs[1].LoopStats().CallerYields >= 3 && time.Since(start) > 4*callerYieldInterval
			stop := float32(0)
			if done || time.Now().After(deadline) {
				stop = 1
			}
			got, err := h.Allreduce("x", mustTensor(t, nil, []float32{stop}), AllreduceOptions{Op: Max, Output: out})
			if err != nil {
				return err
			}
			if mustValues[float32](got)[0] == 1 {
				return nil
			}
		}
	})
	elapsed := time.Since(start)
	for r, h := range hs {
		s := h.LoopStats()
		if most := 1 + uint64(elapsed/callerYieldInterval); s.CallerYields < 3 || s.CallerYields > most {
			t.Errorf("rank %d: %+v in %v of blocking allreduces in step: want at least 3 yields, at most one per %v (%d)", r, s, elapsed, callerYieldInterval, most)
		}
	}
}
