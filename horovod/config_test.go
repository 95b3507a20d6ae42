package horovod

import "testing"

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
