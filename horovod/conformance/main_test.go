package conformance

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"strings"
	"testing"

	"github.com/gorovod/gorovod/horovod"
	"github.com/gorovod/gorovod/horovod/backend"
	"github.com/gorovod/gorovod/horovod/internal/rawmpi"
	"github.com/gorovod/gorovod/horovod/mpi"
)

var (
	hvd *horovod.Horovod
	// raw holds MPI_Allreduce's own results for rawInput, by "dtype/op", computed before horovod
	// starts; nil outside mpirun.
	raw map[string][]byte
	// world is the MPI backend horovod runs on; nil outside mpirun.
	world *mpi.Comm
	// hosts is the hostname each rank sees, by rank, gathered with raw MPI before horovod starts:
	// the reference for horovod's local and cross ranks. Nil outside mpirun.
	hosts []string
)

// underMPI tells whether a launcher started this process as a rank: mpirun, or srun --mpi=pmix
// (the variables horovod's own launcher detection reads).
func underMPI() bool { return os.Getenv("OMPI_COMM_WORLD_SIZE") != "" || underSrun() }

// underSrun tells whether srun --mpi=pmix started this process as a rank (under mpirun inside an
// allocation the Slurm variables are the batch script's, and OpenMPI's are set; Slurm's
// variables without a PMIx rank are TestLauncherAndMPIMustAgree's process).
func underSrun() bool {
	return os.Getenv("OMPI_COMM_WORLD_SIZE") == "" && os.Getenv("SLURM_PROCID") != "" && os.Getenv("PMIX_RANK") != ""
}

func TestMain(m *testing.M) {
	if os.Getenv(initFailureEnv) != "" || os.Getenv(initSetsEnv) != "" {
		os.Exit(m.Run())
	}
	var err error
	if underMPI() {
		var comm *mpi.Comm
		var settings horovod.Settings
		if settings, err = horovod.ReadSettings(os.LookupEnv); err == nil {
			comm, err = mpi.Open(backend.DriverConfig{Wait: settings.MPIWait, ProcessSets: settings.DynamicProcessSets})
		}
		if err == nil {
			world = comm
			if err = rawReferences(comm); err == nil {
				hvd, err = horovod.Init(horovod.WithBackend(comm))
			}
		}
	} else {
		hvd, err = horovod.Init()
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(2)
	}
	code := m.Run()
	if err := hvd.Shutdown(); err != nil {
		fmt.Fprintln(os.Stderr, err)
		code = 1
	}
	if path := os.Getenv("HOROVOD_TIMELINE"); path != "" && hvd.Rank() == 0 && code == 0 {
		if err := checkTimeline(path); err != nil {
			fmt.Fprintf(os.Stderr, "timeline %s: %v\n", path, err)
			code = 1
		}
	}
	os.Exit(code)
}

// rawInput is rank-dependent, integer-valued data (so float sums are exact in any order).
func rawInput(dt backend.DType, rank, n int) []byte {
	vals := make([]float64, n)
	for i := range vals {
		vals[i] = float64((rank*7919+i*104729)%2001 - 1000)
	}
	return encode(dt, vals)
}

const rawN = 1000

func rawReferences(comm *mpi.Comm) error {
	raw = map[string][]byte{}
	rank := comm.Topology().Rank
	var err error
	if hosts, err = gatherHostnames(comm); err != nil {
		return err
	}
	for _, dt := range []backend.DType{backend.Int32, backend.Int64, backend.Float32, backend.Float64} {
		for _, op := range []backend.ReduceOp{backend.Sum, backend.Min, backend.Max, backend.Product} {
			in := rawInput(dt, rank, rawN)
			out := make([]byte, len(in))
			comm.Do(func() { err = rawmpi.Allreduce(in, out, dt, op) })
			if err != nil {
				return err
			}
			raw[dt.String()+"/"+op.String()] = out
		}
	}
	// One call over more than two of the MPI backend's chunks on one machine
	// (mpi.SharedMemoryAllreduceChunk), which horovod's allreduce of the same tensor splits there.
	in := rawInput(backend.Float32, rank, largeN)
	out := make([]byte, len(in))
	comm.Do(func() { err = rawmpi.Allreduce(in, out, backend.Float32, backend.Sum) })
	raw[largeKey] = out
	if err != nil {
		return err
	}
	if err := rawReducescatterReferences(comm); err != nil {
		return err
	}
	if err := rawProcessSetReferences(comm); err != nil {
		return err
	}
	return rawAlltoallReference(comm)
}

// largeKey is raw's entry for a float32 sum of largeN elements.
const largeKey = "large"

const largeN = (2*mpi.SharedMemoryAllreduceChunk + 4096) / 4

// hostnameSlot bounds a hostname (HOST_NAME_MAX is 64 on Linux).
const hostnameSlot = 256

// gatherHostnames returns every rank's hostname, by rank: each rank writes its name into its own
// slot of a zeroed buffer, and an MPI_Allreduce sum of the buffers is the gathered names.
func gatherHostnames(comm *mpi.Comm) ([]string, error) {
	name, err := os.Hostname()
	if err != nil {
		return nil, err
	}
	if len(name) >= hostnameSlot {
		return nil, fmt.Errorf("hostname %q is longer than %d bytes", name, hostnameSlot-1)
	}
	topo := comm.Topology()
	in := make([]byte, topo.Size*hostnameSlot)
	copy(in[topo.Rank*hostnameSlot:], name)
	out := make([]byte, len(in))
	comm.Do(func() { err = rawmpi.Allreduce(in, out, backend.Uint8, backend.Sum) })
	if err != nil {
		return nil, err
	}
	names := make([]string, topo.Size)
	for r := range names {
		slot := out[r*hostnameSlot : (r+1)*hostnameSlot]
		names[r] = string(slot[:bytes.IndexByte(slot, 0)])
	}
	return names, nil
}

// checkTimeline verifies the trace rank 0 wrote during the suite has the phases of a fused MPI
// allreduce, and that reducescatters and alltoalls went over MPI's own collectives
// (checkWirePhases).
func checkTimeline(path string) error {
	b, err := os.ReadFile(path)
	if err != nil {
		return err
	}
	var events []struct {
		Name string            `json:"name"`
		Ph   string            `json:"ph"`
		PID  int               `json:"pid"`
		Args map[string]string `json:"args"`
	}
	if err := json.Unmarshal(b, &events); err != nil {
		return err
	}
	seen := map[string]bool{}
	tensors := map[int]string{}            // by pid: a row per tensor
	phases := map[string]map[string]bool{} // by tensor
	for _, e := range events {
		switch e.Ph {
		case "M":
			if e.Name == "process_name" {
				tensors[e.PID] = e.Args["name"]
			}
		case "B":
			seen[e.Name] = true
			name := tensors[e.PID]
			if phases[name] == nil {
				phases[name] = map[string]bool{}
			}
			phases[name][e.Name] = true
		}
	}
	want := []string{"NEGOTIATE_ALLREDUCE", "ALLREDUCE", "QUEUE", "MEMCPY_IN_FUSION_BUFFER", "MPI_ALLREDUCE",
		"MEMCPY_OUT_FUSION_BUFFER", "NEGOTIATE_BROADCAST", "MPI_BCAST", "MPI_ALLGATHER",
		"NEGOTIATE_REDUCESCATTER", "REDUCESCATTER", "MPI_REDUCESCATTER", "NEGOTIATE_ALLTOALL", "ALLTOALL", "MPI_ALLTOALL", "ADASUM"}
	if len(ranksPerHost(hosts)) == 1 && len(hosts) > 1 {
		// The large allreduce and broadcast tests' tensors go over the MPI backend's shared memory.
		want = append(want, "SHM_ALLREDUCE", "SHM_BCAST", "SHM_ALLGATHER")
	}
	if processSetsOn() {
		// TestProcessSets' AddProcessSet: the job's operation.
		want = append(want, "NEGOTIATE_PROCESS_SET", "PROCESS_SET")
		// The set's own allreduces, on rows named after it: rank 0 is in it.
		row := fmt.Sprintf("process set %v: process sets/set/%s", processSetMembers(len(hosts)), processSetCases[0].key())
		if p := phases[row]; !p["ALLREDUCE"] || !p["MPI_ALLREDUCE"] {
			return fmt.Errorf("no row %q with the set's allreduce: %v", row, p)
		}
	}
	var missing []string
	for _, p := range want {
		if !seen[p] {
			missing = append(missing, p)
		}
	}
	if missing != nil {
		return fmt.Errorf("no %s phases among %d events", strings.Join(missing, ", "), len(events))
	}
	return checkWirePhases(phases)
}

// wirePhases are the names of the phases on the wire that the MPI backend writes.
var wirePhases = []string{"MPI_ALLREDUCE", "SHM_ALLREDUCE", "MPI_BCAST", "SHM_BCAST", "MPI_ALLGATHER", "SHM_ALLGATHER",
	"MPI_REDUCESCATTER", "MPI_ALLTOALL"}

// checkWirePhases checks, in the phases of each tensor of the timeline, that every reducescatter
// went over MPI_Reduce_scatter and every alltoall over MPI_Alltoallv (MPI_REDUCESCATTER,
// MPI_ALLTOALL) and nothing else: not horovod's fallbacks, an allreduce or an allgather of the
// whole tensor. The tensors that the raw MPI cross-checks reduce and exchange must have them (an
// operation that failed in negotiation has no wire phase at all), and a member of their grouped
// reducescatter the copies into and out of the fusion buffer.
func checkWirePhases(phases map[string]map[string]bool) error {
	fused := rawReducescatterKey(backend.Float32, horovod.Sum) + "/raw/a" // a member of a grouped reducescatter
	for _, name := range []string{rawReducescatterKey(backend.Float32, horovod.Sum) + "/raw", "alltoall/raw", fused} {
		if phases[name] == nil {
			return fmt.Errorf("no tensor %q", name)
		}
	}
	if !phases[fused]["MEMCPY_IN_FUSION_BUFFER"] || !phases[fused]["MEMCPY_OUT_FUSION_BUFFER"] {
		return fmt.Errorf("reducescatter %q did not go through the fusion buffer", fused)
	}
	// TestAdasum's allreduces combine by Adasum, never by the backend's allreduce.
	adasums := 0
	for name, seen := range phases {
		if !strings.HasPrefix(name, "adasum/") {
			continue
		}
		adasums++
		if !seen["ADASUM"] || seen["MPI_ALLREDUCE"] || seen["SHM_ALLREDUCE"] {
			return fmt.Errorf("Adasum allreduce %q went %v, not by Adasum alone", name, seen)
		}
	}
	if adasums == 0 {
		return errors.New("no Adasum allreduce")
	}
	for name, seen := range phases {
		for op, wire := range map[string]string{"REDUCESCATTER": "MPI_REDUCESCATTER", "ALLTOALL": "MPI_ALLTOALL"} {
			if !seen[op] {
				continue
			}
			var others []string
			for _, p := range wirePhases {
				if seen[p] && p != wire {
					others = append(others, p)
				}
			}
			if others != nil {
				return fmt.Errorf("%s %q went over %s", op, name, strings.Join(others, ", "))
			}
			if strings.HasSuffix(name, "/raw") && !seen[wire] {
				return fmt.Errorf("%s %q has no %s phase", op, name, wire)
			}
		}
	}
	return nil
}
