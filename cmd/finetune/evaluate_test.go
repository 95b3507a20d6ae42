package main

import (
	"errors"
	"io"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/gorovod/gorovod/bertgraph"
	"github.com/gorovod/gorovod/bertgraph/features"
)

// batches numbers count batches by BatchSize (1..count) for inBatchOrder's next.
func batches(count int) func() (*features.Batch, error) {
	i := 0
	return func() (*features.Batch, error) {
		if i == count {
			return nil, io.EOF
		}
		i++
		return &features.Batch{BatchSize: i}, nil
	}
}

func noStop() error { return nil }

// The results reach done in the batches' order although later batches finish first, and n
// batches really run at once: the first n wait until all n have started (a sequential loop
// would fail on the time limit instead of passing).
func TestInBatchOrderRunsNAtOnceAndKeepsOrder(t *testing.T) {
	const n, count = 3, 20
	var running, most atomic.Int32
	var firstN sync.WaitGroup
	firstN.Add(n)
	work := func(b *features.Batch) (int, error) {
		defer running.Add(-1)
		now := running.Add(1)
		for {
			m := most.Load()
			if now <= m || most.CompareAndSwap(m, now) {
				break
			}
		}
		if b.BatchSize <= n {
			firstN.Done()
			waited := make(chan struct{})
			go func() { firstN.Wait(); close(waited) }()
			select {
			case <-waited:
			case <-time.After(10 * time.Second):
				return 0, errors.New("the first batches did not run at once")
			}
		}
		// The earlier a batch in its window, the later it finishes.
		time.Sleep(time.Duration(n-b.BatchSize%n) * time.Millisecond)
		return b.BatchSize * 10, nil
	}
	var got []int
	err := inBatchOrder(batches(count), n, noStop, work, func(b *features.Batch, r int) error {
		if r != b.BatchSize*10 {
			t.Errorf("batch %d got result %d", b.BatchSize, r)
		}
		got = append(got, b.BatchSize)
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	want := make([]int, count)
	for i := range want {
		want[i] = i + 1
	}
	if !slices.Equal(got, want) {
		t.Fatalf("done saw batches %v, want %v", got, want)
	}
	if m := most.Load(); m != n {
		t.Fatalf("at most %d batches ran at once, want %d", m, n)
	}
}

// With n 1 a batch starts only after the one before it is done: the sequential loop.
func TestInBatchOrderOneAtATime(t *testing.T) {
	var running atomic.Int32
	err := inBatchOrder(batches(5), 1, noStop, func(b *features.Batch) (int, error) {
		if running.Add(1) != 1 {
			t.Errorf("batch %d ran beside another", b.BatchSize)
		}
		time.Sleep(time.Millisecond)
		running.Add(-1)
		return 0, nil
	}, func(*features.Batch, int) error { return nil })
	if err != nil {
		t.Fatal(err)
	}
}

// An error of work, done, next or stop is returned; no batch starts after it, every batch
// started has finished when inBatchOrder returns, and done sees no batch after the error.
func TestInBatchOrderStopsAtTheFirstError(t *testing.T) {
	boom := errors.New("boom")
	for _, tc := range []struct {
		name                       string
		failWork, failDone, failAt int // the batch whose work, done or next (or stop before it) fails
		failNext, failStop         bool
	}{
		{name: "work", failWork: 4},
		{name: "done", failDone: 4},
		{name: "next", failAt: 4, failNext: true},
		{name: "stop", failAt: 4, failStop: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			const n = 3
			var started, finished atomic.Int32
			next := batches(20)
			calls := 0
			nextOrFail := func() (*features.Batch, error) {
				calls++
				if tc.failNext && calls == tc.failAt {
					return nil, boom
				}
				return next()
			}
			stops := 0
			stop := func() error {
				stops++
				if tc.failStop && stops == tc.failAt {
					return boom
				}
				return nil
			}
			var seen []int
			err := inBatchOrder(nextOrFail, n, stop, func(b *features.Batch) (int, error) {
				started.Add(1)
				defer finished.Add(1)
				time.Sleep(time.Millisecond)
				if b.BatchSize == tc.failWork {
					return 0, boom
				}
				return 0, nil
			}, func(b *features.Batch, _ int) error {
				seen = append(seen, b.BatchSize)
				if b.BatchSize == tc.failDone {
					return boom
				}
				return nil
			})
			if !errors.Is(err, boom) {
				t.Fatalf("err %v, want boom", err)
			}
			if s, f := started.Load(), finished.Load(); s != f {
				t.Fatalf("%d batches started, %d finished when inBatchOrder returned", s, f)
			}
			// Batches are settled when n are running: before batch 4 is asked for, batch 1 is
			// done; batch 4 starts only after batch 2 is, batch 6 after 3, and 4 fails when
			// settled. After a failure the running ones are waited for, not given to done.
			last := 1 // next or stop failed before batch 4
			switch {
			case tc.failWork != 0:
				last = 3
			case tc.failDone != 0:
				last = 4 // done saw the failing batch itself
			}
			if want := []int{1, 2, 3, 4}[:last]; !slices.Equal(seen, want) {
				t.Fatalf("done saw %v, want %v", seen, want)
			}
			// Batch 4 fails: at most batches 5..4+n-1 were already running, none started after.
			if s := started.Load(); s > int32(4+n-1) {
				t.Fatalf("%d batches started, at most %d may", s, 4+n-1)
			}
		})
	}
}

func TestInferenceBatches(t *testing.T) {
	for _, tc := range []struct {
		cores, intra, inter int
		gpu                 bool
		want                int
	}{
		{2, 1, 0, false, 2},  // make run: 2 ranks x 1 thread on 2 cores, rank 0 alone after
		{2, 2, 0, false, 1},  // one rank with every core
		{2, 1, 1, false, 1},  // one inter-op thread runs one batch at a time
		{16, 4, 0, false, 4}, // 4 ranks of 4 threads
		{96, 1, 0, false, 8}, // bounded
		{16, 2, 3, false, 3}, // --inter_op_threads=3
		{16, 1, 0, true, 1},  // a GPU
		{4, 0, 0, false, 1},  // intra-op threads left to TensorFlow: one per core
	} {
		if got := inferenceBatches(tc.cores, tc.intra, tc.inter, tc.gpu); got != tc.want {
			t.Errorf("inferenceBatches(%d cores, %d intra, %d inter, gpu %v) = %d, want %d",
				tc.cores, tc.intra, tc.inter, tc.gpu, got, tc.want)
		}
	}
}

// The metrics of eval_results.txt from eval_step's batches: accuracy and eval_loss over the
// real examples, loss the mean of the batches' mean losses, a batch of padding alone left out.
func TestEvalSumsMetrics(t *testing.T) {
	var s evalSums
	for _, st := range []bertgraph.EvalStats{
		{LossSum: 2, Correct: 3, Examples: 4}, // mean loss 0.5
		{LossSum: 3, Correct: 0, Examples: 1}, // mean loss 3, the last batch's one real example
		{},                                    // padding alone
	} {
		s.add(st)
	}
	want := evalResult{Accuracy: 0.6, Loss: 1, BatchLoss: 1.75, GlobalStep: 9, Examples: 5}
	if got := s.result(9); got != want {
		t.Errorf("metrics %+v, want %+v", got, want)
	}
}
