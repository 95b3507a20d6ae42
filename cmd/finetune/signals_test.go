package main

import (
	"errors"
	"os"
	"os/exec"
	"runtime"
	"strings"
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

// A second signal exits at once with 128 + its number, and says whether the checkpoint of the
// step the ranks stopped after is written (mpirun's SIGTERM to a rank still shutting down after
// the first exited) or not, as its last line (TensorFlow's start-up lines come first). The stopper
// runs in a child process, which the second signal ends.
func TestStopperSecondSignalExits(t *testing.T) {
	if mode := os.Getenv("STOPPER_CHILD"); mode != "" {
		s := newStopper()
		signalAndWait(t, s, syscall.SIGINT)
		if mode == "written" {
			s.checkpointWritten()
		}
		syscall.Kill(syscall.Getpid(), syscall.SIGTERM)
		time.Sleep(10 * time.Second)
		t.Fatal("still running 10 s after the second signal")
	}
	for mode, want := range map[string]string{
		"written":     "finetune: second terminated: exiting during shutdown, the checkpoint of the last step is written\n",
		"not written": "finetune: second terminated: exiting without a checkpoint\n",
	} {
		cmd := exec.Command(os.Args[0], "-test.run=^TestStopperSecondSignalExits$")
		cmd.Env = append(os.Environ(), "STOPPER_CHILD="+mode)
		var stderr strings.Builder
		cmd.Stderr = &stderr
		err := cmd.Run()
		var ee *exec.ExitError
		if !errors.As(err, &ee) || ee.ExitCode() != 128+int(syscall.SIGTERM) || !strings.HasSuffix(stderr.String(), want) {
			t.Errorf("checkpoint %s: %v, stderr %q; want exit %d and %q", mode, err, stderr.String(), 128+int(syscall.SIGTERM), want)
		}
	}
}
