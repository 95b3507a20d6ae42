// Package mpiwait reads GOROVOD_MPI_WAIT, how a rank of horovod's MPI backend waits for its
// peers in a negotiation round. It is apart from package mpi, pure Go without cgo, so that the
// launcher (gorovodrun) and horovod.Init refuse a bad value as the configuration error it is,
// before any MPI starts.
package mpiwait

import (
	"fmt"
	"os"
)

// Env is the environment variable that says how a rank waits in an allgather whose parts are
// all at most mpi.SleepingWaitMaxPart bytes, as horovod's negotiation rounds are, where the rank
// that arrives first waits for the slowest peer's train step to end:
//
//	sleep (default)  test the collective for 50 µs without pause (a peer that is already there
//	                 answers at MPI's latency), then sleep between tests, 10 µs doubling to 0.5 ms,
//	                 leaving the core to the peers' computation (TensorFlow's threads, with one
//	                 rank per core); a round that waited long ends up to 0.5 ms after the last peer
//	spin             MPI's blocking MPI_Allgatherv, which polls in MPI's progress engine until the
//	                 last peer arrives (for dedicated cores, or with mpirun's mpi_yield_when_idle)
//
// Every other collective is MPI's blocking call: horovod issues them once negotiation has
// established that every rank is there.
const Env = "GOROVOD_MPI_WAIT"

// Sleeping reads a value of Env: true for the sleeping wait ("" or "sleep"), false for "spin";
// anything else is an error naming the variable and the value.
func Sleeping(value string) (bool, error) {
	switch value {
	case "", "sleep":
		return true, nil
	case "spin":
		return false, nil
	default:
		return false, fmt.Errorf("%s=%q: want sleep or spin", Env, value)
	}
}

// FromEnv reads Env from the environment.
func FromEnv() (bool, error) { return Sleeping(os.Getenv(Env)) }
