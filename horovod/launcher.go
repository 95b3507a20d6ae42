package horovod

import (
	"fmt"
	"strconv"
)

// Launcher is the process manager that started this process, as its environment describes it.
type Launcher struct {
	Name string // "mpirun", "mpiexec" (a PMI launcher), "srun"; "" when started by hand
	Rank int    // this process's rank; 0 without a launcher
	Size int    // the processes the launcher started; 1 without a launcher
}

// launcherVariables are the rank and size variables of each launcher, in the order they win:
// OpenMPI's first, since srun can start an mpirun (whose ranks then inherit Slurm's variables),
// then PMI's (MPICH's mpiexec, srun --mpi=pmi2), then Slurm's. Slurm's size is the step's task
// count, which only srun sets: a batch script itself runs as task 0 of the allocation, with
// SLURM_PROCID=0 and SLURM_NTASKS, and a program it starts without srun is a job of its own.
var launcherVariables = []struct{ name, rank, size string }{
	{"mpirun", "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE"},
	{"mpiexec", "PMI_RANK", "PMI_SIZE"},
	{"srun", "SLURM_PROCID", "SLURM_STEP_NUM_TASKS"},
}

// DetectLauncher reads the launcher's variables through lookup (os.LookupEnv). A launcher whose
// variables do not describe a rank within a size is an error naming them.
func DetectLauncher(lookup func(string) (string, bool)) (Launcher, error) {
	for _, v := range launcherVariables {
		rs, ok1 := lookup(v.rank)
		ss, ok2 := lookup(v.size)
		if !ok1 || !ok2 {
			continue
		}
		r, e1 := strconv.Atoi(rs)
		s, e2 := strconv.Atoi(ss)
		if e1 != nil || e2 != nil || s < 1 || r < 0 || r >= s {
			return Launcher{}, fmt.Errorf("horovod: %s=%q %s=%q: not a rank within a size", v.rank, rs, v.size, ss)
		}
		return Launcher{Name: v.name, Rank: r, Size: s}, nil
	}
	return Launcher{Size: 1}, nil
}
