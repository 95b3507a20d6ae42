package main

import (
	"runtime"
	"syscall"
	"testing"
	"time"
)

// TestStopperLeavesNoGoroutine opens and closes stoppers, with and without a caught signal, and
// counts the goroutines: each run of finetune in a test process must leave none behind.
func TestStopperLeavesNoGoroutine(t *testing.T) {
	newStopper().close() // os/signal starts its own dispatcher once, on first use
	before := runtime.NumGoroutine()

	// A caught signal is the stop request, and close still ends the watcher.
	s := newStopper()
	signalAndWait(t, s, syscall.SIGINT)
	s.close()

	for range 20 {
		newStopper().close()
	}
	if after := runtime.NumGoroutine(); after > before {
		t.Fatalf("%d goroutines before, %d after 21 stoppers were closed", before, after)
	}
}

// SIGUSR2, gorovodrun's Ctrl-C as mpirun forwards it, is an interrupt: the ranks exchange and
// report it as SIGINT.
func TestStopperTakesSIGUSR2AsAnInterrupt(t *testing.T) {
	s := newStopper()
	defer s.close()
	signalAndWait(t, s, syscall.SIGUSR2)
}

// signalAndWait sends this process sig and checks that s takes it as an interrupt.
func signalAndWait(t *testing.T, s *stopper, sig syscall.Signal) {
	t.Helper()
	if err := syscall.Kill(syscall.Getpid(), sig); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(10 * time.Second)
	for s.requested() == nil && time.Now().Before(deadline) {
		time.Sleep(time.Millisecond)
	}
	if got := s.requested(); got != syscall.SIGINT {
		t.Fatalf("requested() = %v after %v, want interrupt", got, sig)
	}
}
