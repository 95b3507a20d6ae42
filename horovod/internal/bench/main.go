// Command bench measures horovod against its references in one run, as `make bench` does:
//
//	go build -o bench ./horovod/internal/bench && mpirun -np 2 ./bench
//
// allreduce of 64 MiB float32 through the Reducer against raw MPI_Allreduce of a buffer of the
// same size (timed in a C loop while no horovod instance runs on the communicator), Average with
// its 1/size as a pass of its own and deferred to the consumer (cmd/finetune's path: the sums,
// with the factor folded into apply_gradients' clipping), 4 KiB latency
// against raw MPI, MiniLM's gradients in float32, fp16 and bf16, and, on rank 0 at the end, fp16
// and bf16 conversion per core against copying the same fp32 bytes and against
// github.com/x448/float16. Each row's raw MPI and horovod figures are taken
// back to back, in several rounds, so that both see the same machine load. Ratios are reference time / horovod time: 1 is
// parity, above 1 horovod is faster. Each row also says in how many of rank 0's allgathers (its
// negotiation rounds) horovod/mpi took its roll call, which only a round that waits for a peer
// takes.
package main

import (
	"encoding/binary"
	"flag"
	"fmt"
	"log"
	"math"
	"math/rand/v2"
	"os"
	"regexp"
	"runtime/pprof"
	"slices"
	"time"

	"github.com/x448/float16"

	"github.com/gorovod/gorovod/horovod"
	"github.com/gorovod/gorovod/horovod/backend"
	"github.com/gorovod/gorovod/horovod/bf16"
	"github.com/gorovod/gorovod/horovod/fp16"
	"github.com/gorovod/gorovod/horovod/internal/gradshapes"
	"github.com/gorovod/gorovod/horovod/internal/rawmpi"
	"github.com/gorovod/gorovod/horovod/mpi"
)

var (
	rounds     = flag.Int("rounds", 5, "rounds of every measurement, raw MPI then horovod; the best round counts")
	batches    = flag.Int("batches", 3, "timed batches of each measurement per round; the best batch counts")
	bigIters   = flag.Int("big-iters", 3, "allreduces of the 64 MiB buffer per batch")
	midIters   = flag.Int("mid-iters", 50, "allreduces of the 1 MiB buffer per batch")
	cpuProfile = flag.String("cpuprofile", "", "write rank 0's CPU profile of the timed rows to this file")
	peer       = flag.String("peer", "", "instead of the table, time `make bench-peer`'s collectives at these sizes (e.g. 4K,1M,64M) and print them tab-separated (the process-set rows with HOROVOD_DYNAMIC_PROCESS_SETS=1 only)")
	peerAdasum = flag.String("peer-adasum", "", "instead of the table, compute the Adasum scripts/bench_peer/adasum_check.py computed with Horovod into this file, and compare")
	peerVars   = flag.Bool("peer-variables", false, "instead of the table, time BroadcastVariables of MiniLM's variables against one MPI_Bcast of their bytes, printed as -peer prints")
	only       = flag.String("only", "", "run only the rows whose description (with -peer: the collective's name) matches this regular expression")
	smallIters = flag.Int("small-iters", 300, "allreduces of the 4 KiB buffer per batch")
	longIters  = flag.Int("long-iters", 2000, "broadcasts of 1 MiB per batch in the row of a long run of blocking calls")
	network    = flag.Bool("network", false, "the rows for links between machines instead: MiniLM's gradients "+
		"in float32, fp16 and bf16, 64 MiB and 4 KiB, against raw MPI; no conversion rates")
)

// keepOpen lets successive horovod instances share one MPI communicator: horovod closes its
// backend at Shutdown, and MPI cannot be initialized twice, so Close here does nothing.
type keepOpen struct{ *mpi.Comm }

func (keepOpen) Close() error { return nil }

// ones is n bytes of float32 ones: the inputs of every row, written before they are timed. Memory
// Go has allocated and nothing has written reads from the kernel's shared zero page, which stays
// in cache, and would make a collective that only reads it look faster than one over real memory
// (see parallel's BenchmarkCopy); ones keep the sums finite and away from subnormals.
func ones(n int) []byte {
	b := make([]byte, n)
	for i := 0; i+4 <= n; i += 4 {
		binary.LittleEndian.PutUint32(b[i:], math.Float32bits(1))
	}
	return b
}

// measurement is one row: a horovod figure and the raw MPI figure it is compared with.
type measurement struct {
	what, target string
	raw          func() (float64, error) // on the MPI thread, while no horovod instance runs
	ours         func(*horovod.Horovod) float64
	opts         []horovod.Option // horovod's Init options for the row
}

// rawAllreduce times MPI_Allreduce of a float32 buffer of size bytes in one call: with MPI_IN_PLACE
// when inPlace is set (OpenMPI allocates a temporary then), followed by the division by the job
// size when average is.
func rawAllreduce(size int, inPlace, average bool, iters *int) func() (float64, error) {
	return rawAllreduceIn(0, size, inPlace, average, iters)
}

// rawAllreduceIn is rawAllreduce as MPI_Allreduce calls of at most chunk bytes (0: one call).
func rawAllreduceIn(chunk, size int, inPlace, average bool, iters *int) func() (float64, error) {
	return func() (float64, error) {
		send, recv := ones(size), make([]byte, size)
		if inPlace {
			send = recv
		}
		return rawmpi.TimeAllreduce(send, recv, backend.Float32, average, chunk, *batches, *iters)
	}
}

func main() {
	flag.Parse()
	log.SetFlags(0)
	settings, err := horovod.ReadSettings(os.LookupEnv)
	if err != nil {
		log.Fatal(err)
	}
	comm, err := mpi.Open(backend.DriverConfig{Wait: settings.MPIWait, ProcessSets: settings.DynamicProcessSets})
	if err != nil {
		log.Fatal(err)
	}
	if *peer != "" || *peerVars || *peerAdasum != "" {
		switch {
		case *peerAdasum != "":
			runPeerAdasum(comm, *peerAdasum)
		case *peerVars:
			runPeerVariables(comm)
		default:
			sizes, err := parseSizes(*peer)
			if err != nil {
				log.Fatal(err)
			}
			runPeer(comm, sizes, settings.DynamicProcessSets)
		}
		if err := comm.Close(); err != nil {
			log.Fatal(err)
		}
		return
	}
	const big, mid, small = 64 << 20, 1 << 20, 4 << 10
	one := func(n int) []horovod.NamedTensor {
		return []horovod.NamedTensor{{Name: "g", Tensor: horovod.Tensor{DType: horovod.Float32, Shape: []int{n / 4}, Data: ones(n)}}}
	}
	// 64 gradients of 1 MiB: sliced from one flat buffer (fused in place), and allocated one by
	// one (copied into the fusion buffer).
	flatBuf := ones(big)
	flat, scattered := make([]horovod.NamedTensor, 64), make([]horovod.NamedTensor, 64)
	for i := range flat {
		name := fmt.Sprintf("g%02d", i)
		flat[i] = horovod.NamedTensor{Name: name, Tensor: horovod.Tensor{DType: horovod.Float32, Shape: []int{big / 64 / 4}, Data: flatBuf[i*big/64 : (i+1)*big/64]}}
		scattered[i] = horovod.NamedTensor{Name: name, Tensor: horovod.Tensor{DType: horovod.Float32, Shape: []int{big / 64 / 4}, Data: ones(big / 64)}}
	}
	// The same 64 gradients in the MPI backend's shared memory, as finetune's gradient buffer is
	// when every rank runs on this machine (an allreduce over it is SHM_ALLREDUCE); Go memory
	// elsewhere, where the backend lends none.
	sharedBuf, err := comm.AllocHost(big)
	if err != nil {
		sharedBuf = make([]byte, big)
	}
	copy(sharedBuf, ones(big))
	shared := make([]horovod.NamedTensor, 64)
	for i := range shared {
		shared[i] = horovod.NamedTensor{Name: fmt.Sprintf("g%02d", i), Tensor: horovod.Tensor{DType: horovod.Float32, Shape: []int{big / 64 / 4}, Data: sharedBuf[i*big/64 : (i+1)*big/64]}}
	}
	bigOne, smallOne := one(big), one(small)
	reducer := func(opts horovod.ReducerOptions, grads []horovod.NamedTensor, iters *int) func(*horovod.Horovod) float64 {
		return func(h *horovod.Horovod) float64 { return timeReducer(h, opts, grads, *iters) }
	}
	sum := horovod.ReducerOptions{Op: horovod.Sum}
	inPlace := horovod.ReducerOptions{Op: horovod.Sum, InPlace: true}
	// general times Allreduce of one tensor of size bytes: into a new result (given back with
	// Release after each call when into is released), or into a reused Output.
	type resultInto int
	const (
		newResult resultInto = iota
		released
		reusedOutput
	)
	general := func(size int, op horovod.ReduceOp, into resultInto, iters *int) func(*horovod.Horovod) float64 {
		t := one(size)[0].Tensor
		o := horovod.AllreduceOptions{Op: op}
		if into == reusedOutput {
			o.Output = make([]byte, size)
		}
		return func(h *horovod.Horovod) float64 {
			return timeCalls(h, *iters, func() error {
				got, err := h.Allreduce("t", t, o)
				if err == nil && into == released {
					err = h.Release(got)
				}
				return err
			})
		}
	}
	bigRow := measurement{"allreduce 64 MiB float32 sum, one tensor, out of place", "", rawAllreduce(big, false, false, bigIters), reducer(sum, bigOne, bigIters), nil}
	latencyRow := measurement{"allreduce 4 KiB float32 sum (latency), out of place", "", rawAllreduce(small, false, false, smallIters), reducer(sum, smallOne, smallIters), nil}
	ms := []measurement{
		bigRow,
		// horovod/mpi splits a long allreduce into calls of comm.AllreduceChunk() bytes on one
		// machine: the same calls made by raw MPI are what horovod's own overhead is measured by.
		{"  the same, raw MPI as the same 4 MiB calls as horovod/mpi", "", rawAllreduceIn(comm.AllreduceChunk(), big, false, false, bigIters), reducer(sum, bigOne, bigIters), nil},
		{"  64 x 1 MiB from one flat buffer, fused, out of place", "  (target >= 0.95)", rawAllreduce(big, false, false, bigIters), reducer(sum, flat, bigIters), nil},
		{"  64 x 1 MiB from one flat buffer, fused, InPlace", "  (target >= 0.95)", rawAllreduce(big, true, false, bigIters), reducer(inPlace, flat, bigIters), nil},
		{"  64 x 1 MiB allocated apart, via the fusion buffer (in place)", "", rawAllreduce(big, true, false, bigIters), reducer(sum, scattered, bigIters), nil},
		{"  64 x 1 MiB flat, InPlace, average (postscale 1/size)", "", rawAllreduce(big, true, true, bigIters), reducer(horovod.ReducerOptions{InPlace: true}, flat, bigIters), nil},
		{"  64 x 1 MiB flat, InPlace, average deferred (finetune)", "  (target >= 0.95)", rawAllreduce(big, true, false, bigIters), reducer(horovod.ReducerOptions{InPlace: true, DeferAverage: true}, flat, bigIters), nil},
		{"  64 x 1 MiB flat in the backend's shared memory, InPlace, average deferred (finetune)", "  (target >= 0.95)", rawAllreduce(big, true, false, bigIters), reducer(horovod.ReducerOptions{InPlace: true, DeferAverage: true}, shared, bigIters), nil},
		{"  64 x 1 MiB flat, average, fp16 compression (in place)", "", rawAllreduce(big, true, true, bigIters), reducer(horovod.ReducerOptions{Compression: horovod.FP16Compression}, flat, bigIters), nil},
		latencyRow,
		// The general API, one tensor per call, against MPI out of place (Allreduce returns a new
		// tensor); Average against MPI's sum followed by the division.
		{"Allreduce (one tensor, new result) 4 KiB sum", "  (target: 20 us)", rawAllreduce(small, false, false, smallIters), general(small, horovod.Sum, newResult, smallIters), nil},
		{"  1 MiB sum", "  (target >= 0.9)", rawAllreduce(mid, false, false, midIters), general(mid, horovod.Sum, newResult, midIters), nil},
		{"  1 MiB average", "  (target >= 0.9)", rawAllreduce(mid, false, true, midIters), general(mid, horovod.Average, newResult, midIters), nil},
		{"  64 MiB sum", "  (target >= 0.9)", rawAllreduce(big, false, false, bigIters), general(big, horovod.Sum, newResult, bigIters), nil},
		{"  64 MiB average", "  (target >= 0.9)", rawAllreduce(big, false, true, bigIters), general(big, horovod.Average, newResult, bigIters), nil},
		// A batch of about 0.15 s of blocking calls in step, where the others' batches last
		// milliseconds: Go's runtime takes the processor of a goroutine that runs for 10 ms
		// without being scheduled, unless horovod yields it (LoopStats.CallerYields).
		{"BroadcastVariables 1 x 1 MiB in place, long batches of calls", "", rawBroadcast(mid, longIters), broadcastVariables(1, mid, longIters), nil},
		{"BroadcastVariables 1024 x 4 KiB, fused (raw: one 4 MiB MPI_Bcast)", "", rawBroadcast(4<<20, midIters), broadcastVariables(1024, 4<<10, midIters), nil},
		{"  the same, one broadcast per variable (fusion off)", "", rawBroadcast(4<<20, midIters), broadcastVariables(1024, 4<<10, midIters), []horovod.Option{horovod.WithFusionThreshold(0)}},
		{"BroadcastVariables 256 x 64 KiB, fused (raw: one 16 MiB MPI_Bcast)", "", rawBroadcast(16<<20, midIters), broadcastVariables(256, 64<<10, midIters), nil},
		{"  the same, one broadcast per variable (fusion off)", "", rawBroadcast(16<<20, midIters), broadcastVariables(256, 64<<10, midIters), []horovod.Option{horovod.WithFusionThreshold(0)}},
		{"Allreduce (one tensor, new result given back with Release) 4 KiB sum", "  (target: 20 us)", rawAllreduce(small, false, false, smallIters), general(small, horovod.Sum, released, smallIters), nil},
		{"  1 MiB sum", "  (target >= 0.9)", rawAllreduce(mid, false, false, midIters), general(mid, horovod.Sum, released, midIters), nil},
		{"  1 MiB average", "  (target >= 0.9)", rawAllreduce(mid, false, true, midIters), general(mid, horovod.Average, released, midIters), nil},
		{"  64 MiB sum", "  (target >= 0.9)", rawAllreduce(big, false, false, bigIters), general(big, horovod.Sum, released, bigIters), nil},
		{"  64 MiB average", "  (target >= 0.9)", rawAllreduce(big, false, true, bigIters), general(big, horovod.Average, released, bigIters), nil},
		{"Allreduce (one tensor, into a reused Output) 4 KiB sum", "  (target: 20 us)", rawAllreduce(small, false, false, smallIters), general(small, horovod.Sum, reusedOutput, smallIters), nil},
		{"  1 MiB sum", "  (target >= 0.9)", rawAllreduce(mid, false, false, midIters), general(mid, horovod.Sum, reusedOutput, midIters), nil},
		{"  1 MiB average", "  (target >= 0.9)", rawAllreduce(mid, false, true, midIters), general(mid, horovod.Average, reusedOutput, midIters), nil},
		{"  64 MiB sum", "  (target >= 0.9)", rawAllreduce(big, false, false, bigIters), general(big, horovod.Sum, reusedOutput, bigIters), nil},
		{"  64 MiB average", "  (target >= 0.9)", rawAllreduce(big, false, true, bigIters), general(big, horovod.Average, reusedOutput, bigIters), nil},
	}
	// MiniLM's gradients uncompressed, then in float16 and bfloat16, against raw MPI in float32.
	grads := miniLMGradients()
	miniLMRows := []measurement{
		{"allreduce MiniLM's gradients, 105 tensors, fused, float32", "", rawAllreduce(sizeOf(grads), true, false, bigIters), reducer(sum, grads, bigIters), nil},
		{"  the same, fp16 compression (raw MPI: float32)", "", rawAllreduce(sizeOf(grads), true, false, bigIters), reducer(horovod.ReducerOptions{Op: horovod.Sum, Compression: horovod.FP16Compression}, grads, bigIters), nil},
		{"  the same, bf16 compression (raw MPI: float32)", "", rawAllreduce(sizeOf(grads), true, false, bigIters), reducer(horovod.ReducerOptions{Op: horovod.Sum, Compression: horovod.BF16Compression}, grads, bigIters), nil},
	}
	// Many reducescatters at once, as a sharded optimizer makes them: grouped, those under 256 KiB
	// fuse into backend reduce-scatters of batches closed once they reach 256 KiB, the larger go
	// one by one; with
	// fusion off, one per tensor. Raw MPI: one MPI_Reduce_scatter of all their bytes.
	ranks := comm.Topology().Size
	small256 := make([]horovod.NamedTensor, 256)
	for i := range small256 {
		small256[i] = horovod.NamedTensor{Name: fmt.Sprintf("s%03d", i), Tensor: horovod.Tensor{DType: horovod.Float32, Shape: []int{16 << 10 / 4}, Data: ones(16 << 10)}}
	}
	ms = append(ms,
		measurement{"GroupedReducescatter 256 x 16 KiB sum, fused in 256 KiB batches (raw: one 4 MiB MPI_Reduce_scatter)", "", rawReducescatter(4<<20, ranks, midIters), groupedReducescatter(small256, midIters), nil},
		measurement{"  the same, one reducescatter per tensor (fusion off)", "", rawReducescatter(4<<20, ranks, midIters), groupedReducescatter(small256, midIters), []horovod.Option{horovod.WithFusionThreshold(0)}},
		measurement{"GroupedReducescatter MiniLM's gradients sum, 105 tensors, those under 256 KiB fused", "", rawReducescatter(sizeOf(grads), ranks, bigIters), groupedReducescatter(grads, bigIters), nil},
		measurement{"  the same, one reducescatter per tensor (fusion off)", "", rawReducescatter(sizeOf(grads), ranks, bigIters), groupedReducescatter(grads, bigIters), []horovod.Option{horovod.WithFusionThreshold(0)}},
	)
	// A process set of the first and the last rank (with 3 ranks, the middle one idles in the
	// job), when the job allows process sets: the set's Allreduce against MPI_Allreduce on a
	// communicator raw MPI splits alike. Meanwhile a rank outside the set waits in the job's
	// Allreduce of the figures, which the members join once timed: a job operation some rank has
	// submitted makes every rank's job loop negotiate every HOROVOD_CYCLE_TIME, which on a
	// machine whose cores all run ranks takes CPU from the set's members (3 ranks on 2 cores:
	// the set's 1 MiB allreduces 1.7-2x as long at 1 ms as at 20 ms). The rows run the job, and
	// the set with it, at 20 ms (a set's members calling in step run its rounds themselves), and
	// one row at the default.
	if settings.DynamicProcessSets && ranks > 1 {
		members := []int{0, ranks - 1}
		member := slices.Contains(members, comm.Topology().Rank)
		slowJob := []horovod.Option{horovod.WithCycleTime(20 * time.Millisecond)}
		setRow := func(what string, size int, iters *int, opts []horovod.Option) measurement {
			raw := func() (float64, error) {
				return rawmpi.TimeSubsetAllreduce(member, ones(size), make([]byte, size), backend.Float32, *batches, *iters)
			}
			return measurement{what, "", raw, processSetAllreduce(members, size, iters), opts}
		}
		ms = append(ms,
			setRow(fmt.Sprintf("process set of ranks %v: Allreduce into a reused Output 4 KiB sum", members), small, smallIters, slowJob),
			setRow("  the process set, 1 MiB sum", mid, midIters, slowJob),
			setRow("  the process set, 64 MiB sum", big, bigIters, slowJob),
			setRow("  the process set, 1 MiB sum, the job's cycle time 1 ms", mid, midIters, nil),
		)
	}
	if *network {
		ms = append(miniLMRows, bigRow, latencyRow)
	} else {
		ms = append(ms, miniLMRows...)
	}
	if *only != "" {
		re, err := regexp.Compile(*only)
		if err != nil {
			log.Fatal(err)
		}
		ms = slices.DeleteFunc(ms, func(m measurement) bool { return !re.MatchString(m.what) })
	}
	raw, ours := make([]float64, len(ms)), make([]float64, len(ms))
	// The allgathers of horovod's runs of each row (its negotiation rounds, and the data of an
	// allgather), and how many of them took the roll call, which only a round that waits takes.
	gathers, rollCalls := make([]uint64, len(ms)), make([]uint64, len(ms))
	// horovod's negotiation rounds of each row and how many of them the caller of a blocking
	// operation ran itself (horovod.LoopStats), without a hand-over to the background loop.
	negotiations, callerRounds := make([]uint64, len(ms)), make([]uint64, len(ms))
	for i := range ms {
		raw[i], ours[i] = math.Inf(1), math.Inf(1)
	}
	var rank, size int
	if *cpuProfile != "" && comm.Topology().Rank == 0 {
		f, err := os.Create(*cpuProfile)
		if err != nil {
			log.Fatal(err)
		}
		if err := pprof.StartCPUProfile(f); err != nil {
			log.Fatal(err)
		}
	}
	// Each row's raw MPI and horovod figures are taken back to back, round after round, so that
	// both see the same machine load; horovod is stopped while raw MPI runs.
	for range *rounds {
		for i, m := range ms {
			var t float64
			comm.Do(func() { t, err = m.raw() })
			if err != nil {
				log.Fatal(err)
			}
			raw[i] = min(raw[i], t)
			hvd, err := horovod.Init(append([]horovod.Option{horovod.WithBackend(keepOpen{comm})}, m.opts...)...)
			if err != nil {
				log.Fatal(err)
			}
			gathers0, called0 := comm.RollCalls()
			ours[i] = min(ours[i], m.ours(hvd))
			g, called := comm.RollCalls()
			gathers[i] += g - gathers0
			rollCalls[i] += called - called0
			st := hvd.LoopStats()
			negotiations[i] += st.Rounds
			callerRounds[i] += st.CallerRounds
			rank, size = hvd.Rank(), hvd.Size()
			if err := hvd.Shutdown(); err != nil {
				log.Fatal(err)
			}
		}
	}
	pprof.StopCPUProfile() // does nothing when no profile was started
	if err := comm.Close(); err != nil {
		log.Fatal(err)
	}
	if rank != 0 {
		return
	}
	fmt.Printf("horovod bench: %d ranks, mpi backend; time per call: best of %d rounds x %d batches, slowest rank\n", size, *rounds, *batches)
	for i, m := range ms {
		fmt.Printf("  %-60s raw MPI %9s  horovod %9s  ratio %.2f  roll calls %3.0f%%  caller's rounds %3.0f%%%s\n", m.what, dur(raw[i]), dur(ours[i]), raw[i]/ours[i],
			100*float64(rollCalls[i])/float64(max(gathers[i], 1)), 100*float64(callerRounds[i])/float64(max(negotiations[i], 1)), m.target)
	}
	if i := slices.IndexFunc(ms, func(m measurement) bool { return m.what == miniLMRows[0].what }); i >= 0 && i+2 < len(ms) {
		fmt.Printf("  compression's gain on MiniLM's gradients: fp16 %.2fx, bf16 %.2fx faster than float32 (target >= 1.8 where the wire is the limit)\n",
			ours[i]/ours[i+1], ours[i]/ours[i+2])
	}
	if *network {
		return
	}
	conversionRates()
}

// rawBroadcast times MPI_Bcast of size bytes from rank 0.
func rawBroadcast(size int, iters *int) func() (float64, error) {
	return func() (float64, error) { return rawmpi.TimeBroadcast(ones(size), *batches, *iters) }
}

// rawReducescatter times MPI_Reduce_scatter sum of about n bytes of float32 (whole elements for
// every one of size ranks) in equal blocks.
func rawReducescatter(n, size int, iters *int) func() (float64, error) {
	block := n / size / 4 * 4
	return func() (float64, error) {
		return rawmpi.TimeReducescatter(ones(block*size), make([]byte, block), horovod.Float32, false, *batches, *iters)
	}
}

// groupedReducescatter times GroupedReducescatter sum of ts, giving its results back with
// Release after each call.
func groupedReducescatter(ts []horovod.NamedTensor, iters *int) func(*horovod.Horovod) float64 {
	return func(h *horovod.Horovod) float64 {
		return timeCalls(h, *iters, func() error {
			return releasedAll(h, true)(h.GroupedReducescatter(ts, horovod.ReducescatterOptions{Op: horovod.Sum}))
		})
	}
}

// broadcastVariables times BroadcastVariables from rank 0 of n float32 variables of size bytes,
// each allocated on its own (the fused broadcast copies them through the fusion buffer).
func broadcastVariables(n, size int, iters *int) func(*horovod.Horovod) float64 {
	vars := make([]horovod.NamedTensor, n)
	for i := range vars {
		vars[i] = horovod.NamedTensor{Name: fmt.Sprintf("v%04d", i),
			Tensor: horovod.Tensor{DType: horovod.Float32, Shape: []int{size / 4}, Data: ones(size)}}
	}
	return func(h *horovod.Horovod) float64 { return timeBroadcastVariables(h, vars, *iters) }
}

// timeBroadcastVariables times BroadcastVariables of vars from rank 0 with timeCalls.
func timeBroadcastVariables(h *horovod.Horovod, vars []horovod.NamedTensor, iters int) float64 {
	return timeCalls(h, iters, func() error { return h.BroadcastVariables(vars, 0) })
}

// timeReducer times the reducer on grads with timeCalls.
func timeReducer(hvd *horovod.Horovod, opts horovod.ReducerOptions, grads []horovod.NamedTensor, iters int) float64 {
	red, err := hvd.NewReducer(opts)
	if err != nil {
		log.Fatal(err)
	}
	return timeCalls(hvd, iters, func() error {
		_, _, err := red.Reduce(grads)
		return err
	})
}

// timeCalls times call as rawmpi times MPI: after one warm-up call, batches of iters calls,
// each batch after a barrier; the slowest rank's best batch mean in seconds per call.
func timeCalls(hvd *horovod.Horovod, iters int, call func() error) float64 {
	if err := call(); err != nil {
		log.Fatal(err)
	}
	best := []float64{1e300}
	for range *batches {
		if err := hvd.Barrier(); err != nil {
			log.Fatal(err)
		}
		start := time.Now()
		for range iters {
			if err := call(); err != nil {
				log.Fatal(err)
			}
		}
		best[0] = min(best[0], time.Since(start).Seconds()/float64(iters))
	}
	return slowest(hvd, best[0])
}

// slowest is the largest of every rank's t, on every rank.
func slowest(hvd *horovod.Horovod, t float64) float64 {
	x, _ := horovod.NewTensor(nil, []float64{t})
	most, err := hvd.Allreduce("bench/time", x, horovod.AllreduceOptions{Op: horovod.Max})
	if err != nil {
		log.Fatal(err)
	}
	v, _ := horovod.Values[float64](most)
	return v[0]
}

// processSetAllreduce times Allreduce sums of size bytes into a reused Output in a process set
// of members, added for the row (setAllreduce): the slowest member's figure, on every rank.
func processSetAllreduce(members []int, size int, iters *int) func(*horovod.Horovod) float64 {
	x := horovod.Tensor{DType: horovod.Float32, Shape: []int{size / 4}, Data: ones(size)}
	out := make([]byte, size)
	return func(h *horovod.Horovod) float64 { return setAllreduce(h, members, x, out, "gorovod_reused", *iters) }
}

// miniLMGradients are the gradients of finetune's default model (gradshapes.MiniLM), each
// allocated apart as a train step's fetches are.
func miniLMGradients() []horovod.NamedTensor {
	shapes := gradshapes.MiniLM()
	var grads []horovod.NamedTensor
	for i, v := range gradshapes.Random(shapes, 3) {
		t, err := horovod.NewTensor(shapes[i], v)
		if err != nil {
			log.Fatal(err)
		}
		grads = append(grads, horovod.NamedTensor{Name: fmt.Sprintf("g%03d", i), Tensor: t})
	}
	return grads
}

func sizeOf(ts []horovod.NamedTensor) int {
	n := 0
	for _, t := range ts {
		n += len(t.Data)
	}
	return n
}

func dur(s float64) string {
	return time.Duration(s * float64(time.Second)).Round(time.Microsecond).String()
}

// conversionRates measures one core converting 64 MiB of float32 (far larger than the caches)
// against copying the same bytes.
func conversionRates() {
	const n = 16 << 20
	src := make([]float32, n)
	r := rand.New(rand.NewPCG(1, 1))
	for i := range src {
		src[i] = float32(r.NormFloat64())
	}
	halves := make([]uint16, n)
	back := make([]float32, n)
	copyDst := make([]float32, n)
	rate := func(f func()) float64 { // GB/s of float32 bytes
		f()
		best := 0.0
		for range 5 {
			start := time.Now()
			f()
			best = max(best, float64(4*n)/time.Since(start).Seconds()/1e9)
		}
		return best
	}
	memcpy := rate(func() { copy(copyDst, src) })
	enc := rate(func() { fp16.EncodeFloat32(halves, src) })
	dec := rate(func() { fp16.DecodeFloat32(back, halves) })
	x448enc := rate(func() {
		for i, f := range src {
			halves[i] = float16.Fromfloat32(f).Bits()
		}
	})
	x448dec := rate(func() {
		for i, h := range halves {
			back[i] = float16.Frombits(h).Float32()
		}
	})
	path := "portable"
	if fp16.Accelerated() {
		path = "F16C"
	}
	fmt.Printf("fp16 conversion, one core, 64 MiB of float32 (%s path); rates in GB/s of float32 bytes\n", path)
	fmt.Printf("  memcpy %.2f\n", memcpy)
	fmt.Printf("  encode %.2f: %.2fx memcpy (target >= 0.8), %.1fx x448/float16 at %.2f (target >= 5)\n", enc, enc/memcpy, enc/x448enc, x448enc)
	fmt.Printf("  decode %.2f: %.2fx memcpy (target >= 0.8), %.1fx x448/float16 at %.2f (target >= 5)\n", dec, dec/memcpy, dec/x448dec, x448dec)
	bfEnc := rate(func() { bf16.EncodeFloat32(halves, src) })
	bfDec := rate(func() { bf16.DecodeFloat32(back, halves) })
	bfPath := "portable"
	if bf16.Accelerated() {
		bfPath = "AVX2"
	}
	fmt.Printf("bf16 conversion, one core, the same 64 MiB (%s path)\n", bfPath)
	fmt.Printf("  encode %.2f: %.2fx memcpy, %.2fx fp16's\n", bfEnc, bfEnc/memcpy, bfEnc/enc)
	fmt.Printf("  decode %.2f: %.2fx memcpy, %.2fx fp16's\n", bfDec, bfDec/memcpy, bfDec/dec)
	os.Stdout.Sync()
}
