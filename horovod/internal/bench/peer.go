package main

import (
	"fmt"
	"log"
	"regexp"
	"runtime"
	"slices"
	"strconv"
	"strings"

	"github.com/gorovod/gorovod/horovod"
	"github.com/gorovod/gorovod/horovod/internal/rawmpi"
	"github.com/gorovod/gorovod/horovod/mpi"
)

// peerCollectives are the rows of `make bench-peer`, in the order scripts/bench_peer prints
// them; scripts/bench_peer/horovod_collectives.py times the same calls of Horovod's.
var peerCollectives = []string{"allreduce_sum", "allreduce_average", "allreduce_average_fp16", "allreduce_adasum", "allgather", "broadcast",
	"reducescatter_sum", "reducescatter_average", "alltoall", "grouped_reducescatter_sum", "grouped_allgather"}

// peerSetCollectives are the rows of `make bench-peer` that run in a job allowing process sets
// (HOROVOD_DYNAMIC_PROCESS_SETS=1), a run of their own: a process set of the first and the last
// rank, added for the row (Horovod's side: initialized with it).
var peerSetCollectives = []string{"process_set_allreduce_sum"}

// peerGroup is how many tensors of equal size the grouped rows split their bytes into, as
// scripts/bench_peer's GROUP.
const peerGroup = 64

// parseSizes reads a comma-separated list of byte counts with an optional K or M suffix.
func parseSizes(list string) ([]int, error) {
	var sizes []int
	for _, f := range strings.Split(list, ",") {
		mult := 1
		switch {
		case strings.HasSuffix(f, "K"):
			mult, f = 1<<10, strings.TrimSuffix(f, "K")
		case strings.HasSuffix(f, "M"):
			mult, f = 1<<20, strings.TrimSuffix(f, "M")
		}
		n, err := strconv.Atoi(f)
		if err != nil || n <= 0 || n*mult%4 != 0 {
			return nil, fmt.Errorf("-peer: size %q: want a positive number of bytes, a multiple of 4, with K or M", f)
		}
		sizes = append(sizes, n*mult)
	}
	return sizes, nil
}

// peerIters is how many calls of size bytes one timed batch makes: about 64 MiB of them, at
// least one and at most 300.
func peerIters(size int) int { return max(1, min(300, (64<<20)/size)) }

// runPeer times, for every size, each of peerCollectives through gorovod's general API (one
// tensor per call, a new result, as Horovod's TensorFlow ops return; as gorovod_released, a new
// result given back with Release after each call; and, as gorovod_reused, into a buffer the
// caller reuses (AllreduceOptions.Output, AllgatherInto, ReducescatterOptions.Output,
// AlltoallInto) or in place (BroadcastVariables); not a group's) and, where MPI has the
// operation, raw MPI (a group's: one MPI_Reduce_scatter or MPI_Allgather of its bytes);
// rank 0 prints one tab-separated line per figure:
// implementation, collective, bytes per rank, seconds per call (the slowest rank's best batch).
// With -only, only the collectives whose name matches it.
func runPeer(comm *mpi.Comm, sizes []int, processSets bool) {
	collectives := peerCollectives
	if processSets {
		collectives = append(slices.Clone(peerCollectives), peerSetCollectives...)
	}
	if *only != "" {
		re, err := regexp.Compile(*only)
		if err != nil {
			log.Fatal(err)
		}
		collectives = slices.DeleteFunc(collectives, func(what string) bool { return !re.MatchString(what) })
	}
	ranks := comm.Topology().Size
	setMembers := []int{0, ranks - 1}
	if ranks == 1 {
		setMembers = []int{0}
	}
	member := slices.Contains(setMembers, comm.Topology().Rank)
	type row struct {
		impl, what string
		size       int
		secs       float64
	}
	var rows []row
	var rank int
	for _, size := range sizes {
		iters := peerIters(size)
		// Raw MPI and gorovod's reused row move the same memory: the input x and the output out.
		// A buffer's place in physical memory alone can change a collective's time: on the
		// family-25 AMD EPYC a 1 MiB MPI_Bcast took 60 µs from one buffer and 80-90 µs from
		// another, in about one run in four, whichever side used it.
		x := horovod.Tensor{DType: horovod.Float32, Shape: []int{size / 4}, Data: ones(size)}
		out := make([]byte, size*comm.Topology().Size)
		// Reducescatter and Alltoall split the first dimension in equal blocks, one per rank, as
		// raw MPI's equal counts do: their tensor is x's first elements, a multiple of the ranks
		// (at most ranks-1 elements short of size where size/4 does not divide).
		xs := horovod.Tensor{DType: horovod.Float32, Shape: []int{size / 4 / ranks * ranks}}
		xs.Data = x.Data[:xs.Shape[0]*4]
		// A grouped row's peerGroup tensors, each split so (for a reducescatter), back to back in x.
		part := size / 4 / peerGroup / ranks * ranks
		group := make([]horovod.NamedTensor, peerGroup)
		for i := range group {
			group[i] = horovod.NamedTensor{Name: fmt.Sprintf("g%02d", i),
				Tensor: horovod.Tensor{DType: horovod.Float32, Shape: []int{part}, Data: x.Data[i*part*4 : (i+1)*part*4]}}
		}
		for _, what := range collectives {
			var raw float64
			var err error
			switch what {
			case "allreduce_sum", "allreduce_average":
				comm.Do(func() {
					raw, err = rawmpi.TimeAllreduce(x.Data, out[:size], horovod.Float32, what == "allreduce_average", 0, *batches, iters)
				})
			case "allgather":
				comm.Do(func() { raw, err = rawmpi.TimeAllgather(x.Data, out, *batches, iters) })
			case "broadcast":
				comm.Do(func() { raw, err = rawmpi.TimeBroadcast(x.Data, *batches, iters) })
			case "reducescatter_sum", "reducescatter_average":
				comm.Do(func() {
					raw, err = rawmpi.TimeReducescatter(xs.Data, out[:len(xs.Data)/ranks], horovod.Float32,
						what == "reducescatter_average", *batches, iters)
				})
			case "alltoall":
				comm.Do(func() { raw, err = rawmpi.TimeAlltoall(xs.Data, out[:len(xs.Data)], *batches, iters) })
			case "grouped_allgather": // one MPI_Allgather of all the group's bytes
				all := x.Data[:peerGroup*part*4]
				comm.Do(func() { raw, err = rawmpi.TimeAllgather(all, out[:len(all)*ranks], *batches, iters) })
			case "process_set_allreduce_sum": // MPI_Allreduce on a communicator split alike
				comm.Do(func() {
					raw, err = rawmpi.TimeSubsetAllreduce(member, x.Data, out[:size], horovod.Float32, *batches, iters)
				})
			case "grouped_reducescatter_sum": // one MPI_Reduce_scatter of all the group's bytes
				all := x.Data[:peerGroup*part*4]
				comm.Do(func() {
					raw, err = rawmpi.TimeReducescatter(all, out[:len(all)/ranks], horovod.Float32, false, *batches, iters)
				})
			}
			if err != nil {
				log.Fatal(err)
			}
			if raw > 0 {
				rows = append(rows, row{"mpi", what, size, raw})
			}
			// The earlier rows' results are garbage now (up to 768 MiB at 256 MiB): collected
			// here, not by the first row below whose calls allocate (a new result per call),
			// which otherwise paid for them (2 ranks, 256 MiB Sum: 0.50 s a call after other
			// rows' garbage against 0.03 s alone).
			runtime.GC()
			hvd, err := horovod.Init(horovod.WithBackend(keepOpen{comm}))
			if err != nil {
				log.Fatal(err)
			}
			rank = hvd.Rank()
			if what == "process_set_allreduce_sum" {
				for _, impl := range []string{"gorovod", "gorovod_released", "gorovod_reused"} {
					rows = append(rows, row{impl, what, size, setAllreduce(hvd, setMembers, x, out[:size], impl, iters)})
				}
				if err := hvd.Shutdown(); err != nil {
					log.Fatal(err)
				}
				continue
			}
			// call makes one call into a new result; with release set it gives the result back
			// (Release), as dropping a TensorFlow tensor gives Horovod's output to TF's allocator.
			var call func(release bool) error
			switch what {
			case "allreduce_sum", "allreduce_average":
				o := horovod.AllreduceOptions{Op: horovod.Sum}
				if what == "allreduce_average" {
					o.Op = horovod.Average
				}
				call = func(release bool) error { return released(hvd, release)(hvd.Allreduce("t", x, o)) }
			case "allreduce_adasum":
				o := horovod.AllreduceOptions{Op: horovod.Adasum}
				call = func(release bool) error { return released(hvd, release)(hvd.Allreduce("t", x, o)) }
			case "allreduce_average_fp16":
				red, err := hvd.NewReducer(horovod.ReducerOptions{Compression: horovod.FP16Compression})
				if err != nil {
					log.Fatal(err)
				}
				grads := []horovod.NamedTensor{{Name: "t", Tensor: x}}
				call = func(bool) error { _, _, err := red.Reduce(grads); return err }
			case "allgather":
				call = func(release bool) error { return released(hvd, release)(hvd.Allgather("t", x)) }
			case "broadcast":
				call = func(release bool) error { return released(hvd, release)(hvd.Broadcast("t", x, 0)) }
			case "reducescatter_sum", "reducescatter_average":
				o := horovod.ReducescatterOptions{Op: horovod.Sum}
				if what == "reducescatter_average" {
					o.Op = horovod.Average
				}
				call = func(release bool) error { return released(hvd, release)(hvd.Reducescatter("t", xs, o)) }
			case "alltoall":
				call = func(release bool) error {
					t, _, err := hvd.Alltoall("t", xs, nil)
					return released(hvd, release)(t, err)
				}
			case "grouped_allgather":
				call = func(release bool) error { return releasedAll(hvd, release)(hvd.GroupedAllgather(group)) }
			case "grouped_reducescatter_sum":
				call = func(release bool) error {
					return releasedAll(hvd, release)(hvd.GroupedReducescatter(group, horovod.ReducescatterOptions{Op: horovod.Sum}))
				}
			}
			if what == "allreduce_average_fp16" {
				// A Reducer's results are its arenas, reused from call to call: no new result
				// to leave to the collector or give back, so the row is the reused column's.
				rows = append(rows, row{"gorovod_reused", what, size, timeCalls(hvd, iters, func() error { return call(false) })})
			} else {
				rows = append(rows, row{"gorovod", what, size, timeCalls(hvd, iters, func() error { return call(false) })})
				rows = append(rows, row{"gorovod_released", what, size, timeCalls(hvd, iters, func() error { return call(true) })})
			}
			// The same call into memory the caller reuses, where the API has it: a new result
			// per call costs Go an allocation, page faults and, in a process whose live heap is
			// as small as this one's, a collection every few calls.
			var reused func() error
			switch what {
			case "allreduce_sum", "allreduce_average":
				o := horovod.AllreduceOptions{Op: horovod.Sum, Output: out[:size]}
				if what == "allreduce_average" {
					o.Op = horovod.Average
				}
				reused = func() error { _, err := hvd.Allreduce("t", x, o); return err }
			case "allreduce_adasum":
				o := horovod.AllreduceOptions{Op: horovod.Adasum, Output: out[:size]}
				reused = func() error { _, err := hvd.Allreduce("t", x, o); return err }
			case "allgather":
				reused = func() error { _, err := hvd.AllgatherInto("t", x, out); return err }
			case "broadcast":
				vars := []horovod.NamedTensor{{Name: "t", Tensor: x}}
				reused = func() error { return hvd.BroadcastVariables(vars, 0) }
			case "reducescatter_sum", "reducescatter_average":
				o := horovod.ReducescatterOptions{Op: horovod.Sum, Output: out[:len(xs.Data)/ranks]}
				if what == "reducescatter_average" {
					o.Op = horovod.Average
				}
				reused = func() error { _, err := hvd.Reducescatter("t", xs, o); return err }
			case "alltoall":
				reused = func() error { _, _, err := hvd.AlltoallInto("t", xs, nil, out[:len(xs.Data)]); return err }
			}
			if reused != nil {
				rows = append(rows, row{"gorovod_reused", what, size, timeCalls(hvd, iters, reused)})
			}
			if err := hvd.Shutdown(); err != nil {
				log.Fatal(err)
			}
		}
	}
	if rank == 0 {
		for _, r := range rows {
			fmt.Printf("%s\t%s\t%d\t%.9f\n", r.impl, r.what, r.size, r.secs)
		}
	}
}

// setAllreduce times Allreduce sums of x in a process set of members, added for the call, as
// impl says: into a new result left to the collector ("gorovod"), given back with Release
// ("gorovod_released"), or into out ("gorovod_reused"); the slowest member's figure, on every
// rank of the job.
func setAllreduce(hvd *horovod.Horovod, members []int, x horovod.Tensor, out []byte, impl string, iters int) float64 {
	set, err := hvd.AddProcessSet(members)
	if err != nil {
		log.Fatal(err)
	}
	mine := 0.0
	if set != nil {
		o := horovod.AllreduceOptions{Op: horovod.Sum}
		if impl == "gorovod_reused" {
			o.Output = out
		}
		mine = timeCalls(set, iters, func() error {
			return released(set, impl == "gorovod_released")(set.Allreduce("t", x, o))
		})
		if err := set.Shutdown(); err != nil {
			log.Fatal(err)
		}
	}
	return slowest(hvd, mine)
}

// runPeerVariables times the initial broadcast of finetune's default model: BroadcastVariables
// (fused) of MiniLM's variables from rank 0, against raw MPI broadcasting their bytes in one
// MPI_Bcast; rank 0 prints the two as runPeer does, collective "broadcast_variables", the bytes
// in all. scripts/bench_peer/horovod_finetune.py times Horovod's broadcast_variables of the same
// variables.
func runPeerVariables(comm *mpi.Comm) {
	vars := miniLMGradients()
	size := sizeOf(vars)
	const iters = 3
	var raw float64
	var err error
	comm.Do(func() { raw, err = rawmpi.TimeBroadcast(ones(size), *batches, iters) })
	if err != nil {
		log.Fatal(err)
	}
	hvd, err := horovod.Init(horovod.WithBackend(keepOpen{comm}))
	if err != nil {
		log.Fatal(err)
	}
	ours := timeBroadcastVariables(hvd, vars, iters)
	rank := hvd.Rank()
	if err := hvd.Shutdown(); err != nil {
		log.Fatal(err)
	}
	if rank == 0 {
		fmt.Printf("mpi\tbroadcast_variables\t%d\t%.9f\n", size, raw)
		fmt.Printf("gorovod\tbroadcast_variables\t%d\t%.9f\n", size, ours)
	}
}

// released returns a function that takes a collective's result and error and, with release
// set, gives the result back (horovod.Release).
func released(hvd *horovod.Horovod, release bool) func(horovod.Tensor, error) error {
	return func(t horovod.Tensor, err error) error {
		if err != nil || !release {
			return err
		}
		return hvd.Release(t)
	}
}

// releasedAll is released for a group's results.
func releasedAll(hvd *horovod.Horovod, release bool) func([]horovod.Tensor, error) error {
	return func(ts []horovod.Tensor, err error) error {
		if err != nil || !release {
			return err
		}
		return hvd.Release(ts...)
	}
}
