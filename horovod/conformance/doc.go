// Package conformance is horovod's behavioural test suite, modelled on what Horovod's own tests
// check. Its tests run in every process of a job: `go test` alone runs them as a job of size 1,
// and `make test` also runs the compiled suite under `mpirun -np 2` and `-np 3` (see
// mk/horovod.mk), where results are compared with exact expected values and with raw MPI
// (MPI_Allreduce, MPI_Reduce_scatter, MPI_Alltoallv), and the -np 2 run's timeline must show
// reducescatters and alltoalls on MPI's own collectives. The package has no non-test code.
package conformance
