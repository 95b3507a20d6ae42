package main

import (
	"fmt"
	"os"
	"os/signal"
	"sync/atomic"
	"syscall"
)

// stopper turns SIGINT and SIGTERM into a request to stop at the next step boundary. The ranks
// agree on it through the step's statistics allreduce, so that all of them stop after the same
// step, rank 0 writes a checkpoint, and every rank exits on its own. A second signal exits at
// once. SIGTERM matters as much as SIGINT: mpirun turns a Ctrl-C into SIGTERM for the ranks, and
// schedulers preempt with it. SIGUSR2 is gorovodrun's Ctrl-C, which mpirun forwards to every rank
// at once: it is an interrupt, and reads as SIGINT from here on.
type stopper struct {
	sig    atomic.Value // os.Signal of the first request
	ch     chan os.Signal
	closed chan struct{} // closed by close: the watcher returns
	exited chan struct{} // closed by the watcher as it returns
	// written is set once the checkpoint of the step the ranks stopped after is complete: a
	// second signal then only cuts the shutdown short (mpirun sends SIGTERM to the ranks left
	// once the first exits with 128+n).
	written atomic.Bool
}

func newStopper() *stopper {
	s := &stopper{ch: make(chan os.Signal, 2), closed: make(chan struct{}), exited: make(chan struct{})}
	// A closed standard output (mpirun tearing down its forwarding) must not kill rank 0 in the
	// middle of its last checkpoint: writes then fail with EPIPE instead.
	signal.Ignore(syscall.SIGPIPE)
	signal.Notify(s.ch, syscall.SIGINT, syscall.SIGTERM, syscall.SIGUSR2)
	go s.watch()
	return s
}

func (s *stopper) watch() {
	defer close(s.exited)
	select {
	case first := <-s.ch:
		if first == syscall.SIGUSR2 {
			first = syscall.SIGINT
		}
		s.sig.Store(first)
	case <-s.closed:
		return
	}
	for {
		select {
		case second := <-s.ch:
			if second == syscall.SIGUSR2 {
				continue // gorovodrun's, repeated: its second Ctrl-C ends the job through mpirun
			}
			if s.written.Load() {
				fmt.Fprintf(os.Stderr, "finetune: second %v: exiting during shutdown, the checkpoint of the last step is written\n", second)
			} else {
				fmt.Fprintf(os.Stderr, "finetune: second %v: exiting without a checkpoint\n", second)
			}
			os.Exit(exitCode(second))
		case <-s.closed:
			return
		}
	}
}

// checkpointWritten records that the ranks stopped after a step whose checkpoint is complete.
func (s *stopper) checkpointWritten() { s.written.Store(true) }

// requested returns the signal that asked to stop, or nil.
func (s *stopper) requested() os.Signal {
	v, _ := s.sig.Load().(os.Signal)
	return v
}

// close stops catching the signals and waits for the watcher to return, so that a run inside a
// longer-lived process (the tests) leaves no goroutine behind.
func (s *stopper) close() {
	signal.Stop(s.ch)
	close(s.closed)
	<-s.exited
}

// exitCode is the shell's 128 + signal number.
func exitCode(sig os.Signal) int {
	if n := signalNumber(sig); n != 0 {
		return 128 + n
	}
	return 1
}

// signalNumber is the number of a signal the stopper catches (SIGINT, SIGTERM), which the ranks
// exchange to agree on a stop; 0 for another kind.
func signalNumber(sig os.Signal) int {
	if n, ok := sig.(syscall.Signal); ok {
		return int(n)
	}
	return 0
}
