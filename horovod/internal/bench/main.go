// Command bench measures horovod against its references in one run, as `make bench` does:
//
//	mpirun -np 2 go run ./horovod/internal/bench
//
// allreduce of 64 MiB float32 through the Reducer against raw MPI_Allreduce of the same buffer
// (timed in a C loop, before horovod starts on the communicator), 4 KiB latency against raw MPI,
// and, on rank 0 after the job ends, fp16 conversion per core against copying the same fp32 bytes
// and against github.com/x448/float16. Ratios are reference time / horovod time: 1 is parity.
package main

import (
	"flag"
	"fmt"
	"log"
	"math/rand/v2"
	"os"
	"time"

	"github.com/x448/float16"

	"github.com/gorovod/gorovod/horovod"
	"github.com/gorovod/gorovod/horovod/backend"
	"github.com/gorovod/gorovod/horovod/fp16"
	"github.com/gorovod/gorovod/horovod/internal/rawmpi"
	"github.com/gorovod/gorovod/horovod/mpi"
)

var (
	batches    = flag.Int("batches", 5, "timed batches of each measurement; the best batch counts")
	bigIters   = flag.Int("big-iters", 3, "allreduces of the 64 MiB buffer per batch")
	smallIters = flag.Int("small-iters", 300, "allreduces of the 4 KiB buffer per batch")
)

func main() {
	flag.Parse()
	log.SetFlags(0)
	comm, err := mpi.Open()
	if err != nil {
		log.Fatal(err)
	}
	const big, small = 64 << 20, 4 << 10
	bigBuf, smallBuf := make([]byte, big), make([]byte, small)
	var rawBig, rawSmall float64
	comm.Do(func() {
		if rawBig, err = rawmpi.TimeAllreduce(bigBuf, backend.Float32, *batches, *bigIters); err == nil {
			rawSmall, err = rawmpi.TimeAllreduce(smallBuf, backend.Float32, *batches, *smallIters)
		}
	})
	if err != nil {
		log.Fatal(err)
	}
	hvd, err := horovod.Init(horovod.WithBackend(comm))
	if err != nil {
		log.Fatal(err)
	}
	one := func(n int) []horovod.NamedTensor {
		return []horovod.NamedTensor{{Name: "g", Tensor: horovod.Tensor{DType: horovod.Float32, Shape: []int{n / 4}, Data: make([]byte, n)}}}
	}
	pieces := make([]horovod.NamedTensor, 64)
	for i := range pieces {
		pieces[i] = horovod.NamedTensor{Name: fmt.Sprintf("g%02d", i), Tensor: horovod.Tensor{DType: horovod.Float32, Shape: []int{big / 64 / 4}, Data: bigBuf[i*big/64 : (i+1)*big/64]}}
	}
	oursBig := timeReducer(hvd, horovod.ReducerOptions{Op: horovod.Sum}, one(big), *bigIters)
	oursAvg := timeReducer(hvd, horovod.ReducerOptions{}, one(big), *bigIters)
	oursFused := timeReducer(hvd, horovod.ReducerOptions{Op: horovod.Sum}, pieces, *bigIters)
	oursFP16 := timeReducer(hvd, horovod.ReducerOptions{Compression: horovod.FP16Compression}, one(big), *bigIters)
	oursSmall := timeReducer(hvd, horovod.ReducerOptions{Op: horovod.Sum}, one(small), *smallIters)
	rank, size := hvd.Rank(), hvd.Size()
	if err := hvd.Shutdown(); err != nil {
		log.Fatal(err)
	}
	if rank != 0 {
		return
	}
	fmt.Printf("horovod bench: %d ranks, mpi backend; time per call: best of %d batches, slowest rank\n", size, *batches)
	row := func(what string, ref, ours float64, target string) {
		fmt.Printf("  %-58s raw MPI %9s  horovod %9s  ratio %.2f%s\n", what, dur(ref), dur(ours), ref/ours, target)
	}
	row("allreduce 64 MiB float32 sum, one tensor", rawBig, oursBig, "  (target >= 0.95)")
	row("allreduce 64 MiB float32 sum, 64 x 1 MiB fused", rawBig, oursFused, "")
	row("allreduce 64 MiB float32 average (postscale 1/size)", rawBig, oursAvg, "")
	row("allreduce 64 MiB float32 average, fp16 compression", rawBig, oursFP16, "")
	row("allreduce 4 KiB float32 sum (latency)", rawSmall, oursSmall, "")
	conversionRates()
}

// timeReducer times the reducer on grads as rawmpi times MPI: after one warm-up step, batches of
// iters steps, each after a barrier; the slowest rank's best batch mean in seconds per step.
func timeReducer(hvd *horovod.Horovod, opts horovod.ReducerOptions, grads []horovod.NamedTensor, iters int) float64 {
	red, err := hvd.NewReducer(opts)
	if err != nil {
		log.Fatal(err)
	}
	if _, _, err := red.Reduce(grads); err != nil {
		log.Fatal(err)
	}
	best := []float64{1e300}
	for range *batches {
		if err := hvd.Barrier(); err != nil {
			log.Fatal(err)
		}
		start := time.Now()
		for range iters {
			if _, _, err := red.Reduce(grads); err != nil {
				log.Fatal(err)
			}
		}
		best[0] = min(best[0], time.Since(start).Seconds()/float64(iters))
	}
	t, _ := horovod.NewTensor(nil, best)
	slowest, err := hvd.Allreduce("bench/time", t, horovod.AllreduceOptions{Op: horovod.Max})
	if err != nil {
		log.Fatal(err)
	}
	v, _ := horovod.Values[float64](slowest)
	return v[0]
}

func dur(s float64) string {
	return time.Duration(s * float64(time.Second)).Round(time.Microsecond).String()
}

// conversionRates measures one core converting 16 MiB of float32 (a 64 MiB gradient's quarter:
// large enough to leave the caches) against copying the same bytes.
func conversionRates() {
	const n = 4 << 20
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
	fmt.Printf("fp16 conversion, one core, 16 MiB of float32 (%s path); rates in GB/s of float32 bytes\n", path)
	fmt.Printf("  memcpy %.2f\n", memcpy)
	fmt.Printf("  encode %.2f: %.2fx memcpy (target >= 0.8), %.1fx x448/float16 at %.2f (target >= 5)\n", enc, enc/memcpy, enc/x448enc, x448enc)
	fmt.Printf("  decode %.2f: %.2fx memcpy (target >= 0.8), %.1fx x448/float16 at %.2f (target >= 5)\n", dec, dec/memcpy, dec/x448dec, x448dec)
	os.Stdout.Sync()
}
