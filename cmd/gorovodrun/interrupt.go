package main

import (
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"os/signal"
	"runtime"
	"syscall"
	"time"

	"golang.org/x/term"
)

// stopSignal is what gorovodrun turns a Ctrl-C into: Open MPI's mpirun forwards SIGUSR2 to every
// rank at once (ess_base_forward_signals), where its own Ctrl-C handling would send SIGTERM only
// after the sigkill timeout and SIGKILL as long again later. finetune takes SIGUSR2 as an
// interrupt: the ranks stop after the same step and rank 0 writes its checkpoint, in whatever
// time that takes. So the sigkill timeout no longer has to leave room for a checkpoint, and can
// stay short: Open MPI applies it twice to every failed job before ending it.
const stopSignal = syscall.SIGUSR2

// launch runs mpirun (path, argv) as gorovodrun's child and returns the exit status to exit
// with: mpirun's, 128+n when a signal n ended it, or 128+SIGINT for a job that was interrupted
// and exited 0 all the same. mpirun runs in a process group of its own, so that the terminal's
// Ctrl-C (sent to the foreground group) reaches gorovodrun only: the first SIGINT or SIGTERM
// becomes stopSignal for the ranks, the second is passed to mpirun as SIGINT, which ends the
// job (SIGTERM to the ranks, SIGKILL after the sigkill timeout). Outside the foreground group
// mpirun must not read the terminal (it would be stopped), so a terminal on standard input is
// not passed on; a file or pipe is, as mpirun forwards it to rank 0.
func launch(path string, argv, env []string, stderr io.Writer) int {
	cmd := &exec.Cmd{Path: path, Args: argv, Env: env, Stdout: os.Stdout, Stderr: os.Stderr}
	if !term.IsTerminal(int(os.Stdin.Fd())) {
		cmd.Stdin = os.Stdin
	}
	// Pdeathsig: a gorovodrun killed outright (kill -9) stops the job as its Ctrl-C does. Linux
	// sends it when the thread that started mpirun ends, so that thread stays this goroutine's;
	// and again each time mpirun passes to another of gorovodrun's threads as they end, which is
	// why it is stopSignal (mpirun forwards each, finetune acts on the first) and not SIGTERM (a
	// second one makes mpirun exit at once, leaving its ranks running).
	runtime.LockOSThread()
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: stopSignal}
	signals := make(chan os.Signal, 2)
	signal.Notify(signals, syscall.SIGINT, syscall.SIGTERM)
	defer signal.Stop(signals)
	if err := cmd.Start(); err != nil {
		fmt.Fprintf(stderr, "gorovodrun: running %s: %v\n", path, err)
		return exitCannotExec
	}
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	var interrupted os.Signal
	// mpirun forwards a signal to the ranks that exist, and a rank's Go runtime drops it until
	// the program asks for it: a Ctrl-C right after the launch would be lost on ranks still
	// starting (the whole job ran to its end). So the request is repeated until the job ends;
	// finetune acts on the first.
	var repeat <-chan time.Time
	for {
		select {
		case sig := <-signals:
			if interrupted == nil {
				interrupted = sig
				fmt.Fprintf(stderr, "gorovodrun: %v: asking every rank to stop (again to end the job at once)\n", sig)
				cmd.Process.Signal(stopSignal)
				ticker := time.NewTicker(stopRepeat)
				defer ticker.Stop()
				repeat = ticker.C
			} else {
				repeat = nil
				cmd.Process.Signal(syscall.SIGINT)
			}
		case <-repeat:
			cmd.Process.Signal(stopSignal)
		case err := <-done:
			return exitStatus(err, interrupted)
		}
	}
}

// stopRepeat is how often an interrupted job's ranks are asked again to stop (see launch).
const stopRepeat = 500 * time.Millisecond

// exitStatus is what gorovodrun exits with after mpirun ended with err (see launch). An
// interrupted job whose ranks or mpirun the request itself ended (a rank still loading its
// libraries has SIGUSR2's default action, to end) exits as interrupted.
func exitStatus(err error, interrupted os.Signal) int {
	var ee *exec.ExitError
	switch {
	case errors.As(err, &ee):
		status := ee.ExitCode()
		if ws, ok := ee.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
			status = 128 + int(ws.Signal())
		}
		if interrupted != nil && status == 128+int(stopSignal) {
			return 128 + int(interrupted.(syscall.Signal))
		}
		return status
	case err != nil:
		return exitCannotExec
	case interrupted != nil:
		return 128 + int(interrupted.(syscall.Signal))
	}
	return 0
}
