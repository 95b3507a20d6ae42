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
	if err := syscall.Kill(syscall.Getpid(), syscall.SIGINT); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(10 * time.Second)
	for s.requested() == nil && time.Now().Before(deadline) {
		time.Sleep(time.Millisecond)
	}
	if got := s.requested(); got != syscall.SIGINT {
		t.Fatalf("requested() = %v after SIGINT, want interrupt", got)
	}
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
	if err := syscall.Kill(syscall.Getpid(), syscall.SIGUSR2); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(10 * time.Second)
	for s.requested() == nil && time.Now().Before(deadline) {
		time.Sleep(time.Millisecond)
	}
	if got := s.requested(); got != syscall.SIGINT {
		t.Fatalf("requested() = %v after SIGUSR2, want interrupt", got)
	}
}
