package conformance

import (
	"errors"
	"io/fs"
	"os"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/gorovod/gorovod/horovod"
)

// initFailureEnv is set by make test-mpi for a job whose HOROVOD_TIMELINE is a path that cannot be
// created. Rank 0 alone opens the timeline, so its setup fails and the others' succeeds. TestMain
// then leaves Init to TestInitFailureReachesEveryRank, the only test such a job runs.
const initFailureEnv = "GOROVOD_CONFORMANCE_INIT_FAILURE"

// Every rank must return from Init with an error naming rank 0 and its cause; before the ranks
// agreed on setup, rank 0 finalized MPI while the others waited for it in their first negotiation.
func TestInitFailureReachesEveryRank(t *testing.T) {
	if os.Getenv(initFailureEnv) == "" {
		t.Skip("run by make test-mpi, as a job whose timeline path cannot be created")
	}
	path := os.Getenv("HOROVOD_TIMELINE")
	rank, err := strconv.Atoi(os.Getenv("OMPI_COMM_WORLD_RANK"))
	if path == "" || err != nil {
		t.Fatalf("needs HOROVOD_TIMELINE and mpirun (HOROVOD_TIMELINE=%q, rank: %v)", path, err)
	}
	h, err := horovod.Init()
	if err == nil {
		h.Shutdown()
		t.Fatalf("rank %d: Init succeeded, although rank 0 cannot create %s", rank, path)
	}
	t.Logf("rank %d: %v", rank, err)
	var se *horovod.SetupError
	if !errors.As(err, &se) {
		t.Fatalf("rank %d: %T, want a *horovod.SetupError", rank, err)
	}
	if se.Rank != rank || !slices.Equal(se.Failed, []int{0}) || !strings.Contains(se.Causes[0], "HOROVOD_TIMELINE: open "+path) {
		t.Errorf("rank %d: rank %d, failed ranks %v, causes %q", rank, se.Rank, se.Failed, se.Causes)
	}
	if errors.Is(err, fs.ErrNotExist) != (rank == 0) {
		t.Errorf("rank %d: the error wraps the missing directory's error only on rank 0: %v", rank, errors.Is(err, fs.ErrNotExist))
	}
}
