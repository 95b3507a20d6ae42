package main

import (
	"encoding/binary"
	"fmt"
	"log"
	"math"
	"os"

	"github.com/gorovod/gorovod/horovod"
	"github.com/gorovod/gorovod/horovod/mpi"
)

// adasumLengths are the Adasum check's tensors, as ADASUM_LENGTHS in
// scripts/bench_peer/adasum_check.py.
var adasumLengths = []int{1, 37, 1000, 65536}

// adasumTolerance bounds the check's relative difference per element: Horovod multiplies float32
// elements in float32 and combines shards of its recursive halving, gorovod multiplies in
// float64 and combines shards of its own; both round the result to float32 once per level.
const adasumTolerance = 1e-5

// runPeerAdasum computes with gorovod the Adasum scripts/bench_peer/adasum_check.py computed with
// Horovod into horovodFile, and compares on rank 0: it prints the largest relative difference,
// and fails when it is over adasumTolerance.
func runPeerAdasum(comm *mpi.Comm, horovodFile string) {
	hvd, err := horovod.Init(horovod.WithBackend(keepOpen{comm}))
	if err != nil {
		log.Fatal(err)
	}
	var named []horovod.NamedTensor
	for k, n := range adasumLengths {
		v := make([]float32, n)
		for i := range v {
			v[i] = float32(math.Sin(0.37*float64(i) + 7.919*float64(hvd.Rank()) + float64(k)))
		}
		x, err := horovod.NewTensor(nil, v)
		if err != nil {
			log.Fatal(err)
		}
		named = append(named, horovod.NamedTensor{Name: fmt.Sprintf("adasum%d", k), Tensor: x})
	}
	results, err := hvd.GroupedAllreduce(named, horovod.AllreduceOptions{Op: horovod.Adasum})
	if err != nil {
		log.Fatal(err)
	}
	rank, size := hvd.Rank(), hvd.Size()
	if err := hvd.Shutdown(); err != nil {
		log.Fatal(err)
	}
	if rank != 0 {
		return
	}
	theirs, err := os.ReadFile(horovodFile)
	if err != nil {
		log.Fatal(err)
	}
	worst, where := 0.0, ""
	at := 0
	for k, r := range results {
		ours, _ := horovod.Values[float32](r)
		if len(theirs) < (at+len(ours))*4 {
			log.Fatalf("%s: %d bytes, fewer than the %d tensors' results", horovodFile, len(theirs), len(adasumLengths))
		}
		for i, o := range ours {
			h := math.Float32frombits(binary.LittleEndian.Uint32(theirs[(at+i)*4:]))
			if d := math.Abs(float64(o-h)) / (1 + math.Abs(float64(h))); !(d <= worst) {
				worst, where = d, fmt.Sprintf("tensor %d element %d: gorovod %v, Horovod %v", k, i, o, h)
			}
		}
		at += len(ours)
	}
	fmt.Printf("Adasum on %d ranks, %d float32 tensors: largest difference from Horovod's %.2g (%s)\n", size, len(results), worst, where)
	if !(worst <= adasumTolerance) {
		log.Fatalf("Adasum differs from Horovod's by more than %g", adasumTolerance)
	}
}
