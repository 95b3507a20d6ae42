package horovod

import (
	"errors"
	"os/exec"
	"slices"
	"strings"
	"testing"
)

// Each launcher's variables give its rank and size; OpenMPI's win over PMI's, and PMI's over
// Slurm's, whose variables the ranks of an mpirun or mpiexec inside an allocation inherit.
func TestDetectLauncher(t *testing.T) {
	for _, tc := range []struct {
		env  map[string]string
		want Launcher
	}{
		{nil, Launcher{Size: 1}},
		{map[string]string{"OMPI_COMM_WORLD_RANK": "1", "OMPI_COMM_WORLD_SIZE": "3"}, Launcher{"mpirun", 1, 3}},
		{map[string]string{"PMI_RANK": "2", "PMI_SIZE": "4"}, Launcher{"mpiexec", 2, 4}},
		{map[string]string{"SLURM_PROCID": "0", "SLURM_STEP_NUM_TASKS": "2"}, Launcher{"srun", 0, 2}},
		// A program a batch script starts without srun: the script's own task 0 of the allocation.
		{map[string]string{"SLURM_PROCID": "0", "SLURM_NTASKS": "4"}, Launcher{Size: 1}},
		{map[string]string{"SLURM_PROCID": "0", "SLURM_STEP_NUM_TASKS": "8", "OMPI_COMM_WORLD_RANK": "1", "OMPI_COMM_WORLD_SIZE": "2"}, Launcher{"mpirun", 1, 2}},
		{map[string]string{"SLURM_PROCID": "0", "SLURM_STEP_NUM_TASKS": "8", "PMI_RANK": "3", "PMI_SIZE": "4"}, Launcher{"mpiexec", 3, 4}},
		// A size without a rank is no launcher's complete description.
		{map[string]string{"OMPI_COMM_WORLD_SIZE": "2"}, Launcher{Size: 1}},
	} {
		got, err := DetectLauncher(lookupIn(tc.env))
		if err != nil || got != tc.want {
			t.Errorf("%v: %+v, %v; want %+v", tc.env, got, err, tc.want)
		}
	}
}

func TestDetectLauncherRefuses(t *testing.T) {
	for _, env := range []map[string]string{
		{"OMPI_COMM_WORLD_RANK": "2", "OMPI_COMM_WORLD_SIZE": "2"},
		{"PMI_RANK": "-1", "PMI_SIZE": "2"},
		{"SLURM_PROCID": "0", "SLURM_STEP_NUM_TASKS": "0"},
		{"SLURM_PROCID": "x", "SLURM_STEP_NUM_TASKS": "2"},
	} {
		_, err := DetectLauncher(lookupIn(env))
		if err == nil || !strings.HasSuffix(err.Error(), "not a rank within a size") {
			t.Errorf("%v: %v", env, err)
		}
	}
}

// A program that imports no MPI driver, started by a launcher with more than one process, gets
// an error saying which import it lacks (this test binary imports none).
func TestInitUnderALauncherWithoutDriver(t *testing.T) {
	t.Setenv("PMI_RANK", "0")
	t.Setenv("PMI_SIZE", "2")
	_, err := Init()
	var missing *MissingDriverError
	if !errors.As(err, &missing) || missing.Driver != "mpi" || missing.Launcher != (Launcher{"mpiexec", 0, 2}) {
		t.Fatalf("Init under mpiexec without an MPI driver: %v", err)
	}
	const want = `horovod: mpiexec started 2 processes but no mpi backend is registered: import _ "github.com/gorovod/gorovod/horovod/mpi" in the program`
	if err.Error() != want {
		t.Errorf("error:\n%s\nwant:\n%s", err, want)
	}
}

// The core links no MPI: backends register (database/sql never imports a driver).
func TestDoesNotImportMPI(t *testing.T) {
	out, err := exec.Command("go", "list", "-deps", ".").Output()
	if err != nil {
		// The go command is what runs this test: an error here is a broken package, not a
		// missing tool, and skipping would pass an import of MPI unchecked.
		t.Fatalf("go list: %v", err)
	}
	deps := strings.Fields(string(out))
	if !slices.Contains(deps, "github.com/gorovod/gorovod/horovod") {
		t.Fatalf("go list -deps does not list horovod itself:\n%s", out)
	}
	for _, p := range deps {
		if p == "github.com/gorovod/gorovod/horovod/mpi" || p == "runtime/cgo" {
			t.Errorf("package horovod depends on %s", p)
		}
	}
}
