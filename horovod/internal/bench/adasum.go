package main

import (
	"encoding/binary"
	"fmt"
	"log"
	"math"
	"os"

	"github.com/gorovod/gorovod/horovod"
	"github.com/gorovod/gorovod/horovod/fp16"
	"github.com/gorovod/gorovod/horovod/mpi"
)

// adasumLengths are the Adasum check's tensors, as ADASUM_LENGTHS in
// scripts/bench_peer/adasum_check.py.
var adasumLengths = []int{1, 37, 1000, 65536}

// adasumChecks are the check's dtypes, in the order adasum_check.py writes their results, each
// with the largest difference per element it allows, relative to 1+|x|. float32: Horovod
// multiplies elements in float32 and combines shards of its recursive halving, gorovod
// multiplies in float64 and combines shards of its own; both round to float32 once per level.
// float16: Horovod combines in float32 with float32 coefficients, gorovod in float64, both
// rounding to float16 at every level, where one may round up and the other down; a level whose
// operands nearly cancel carries that step (2^-11 of the operands) into a smaller result. On 4
// ranks on the family-26 EPYC they differed by up to 1.3e-3, each as far from Adasum computed in
// float64 from the same float16 inputs as the other (largest error 1.45e-3 and 1.46e-3, the
// mean 3.36e-4 on both).
var adasumChecks = []struct {
	dt        horovod.DType
	tolerance float64
}{{horovod.Float32, 1e-5}, {horovod.Float16, 4e-3}}

// adasumInput is element i of tensor k on rank r, as adasum_check.py's.
func adasumInput(r, k, i int) float64 {
	return math.Sin(0.37*float64(i) + 7.919*float64(r) + float64(k))
}

// runPeerAdasum computes with gorovod the Adasum scripts/bench_peer/adasum_check.py computed with
// Horovod into horovodFile, and compares on rank 0: it prints the largest relative difference
// per dtype, and fails when one is over its tolerance.
func runPeerAdasum(comm *mpi.Comm, horovodFile string) {
	hvd, err := horovod.Init(horovod.WithBackend(keepOpen{comm}))
	if err != nil {
		log.Fatal(err)
	}
	results := make([][]horovod.Tensor, len(adasumChecks))
	for c, check := range adasumChecks {
		var named []horovod.NamedTensor
		for k, n := range adasumLengths {
			var x horovod.Tensor
			switch check.dt {
			case horovod.Float32:
				v := make([]float32, n)
				for i := range v {
					v[i] = float32(adasumInput(hvd.Rank(), k, i))
				}
				x, err = horovod.NewTensor(nil, v)
			case horovod.Float16:
				v := make([]uint16, n)
				for i := range v {
					v[i] = fp16.FromFloat64(adasumInput(hvd.Rank(), k, i))
				}
				x = horovod.Tensor{DType: horovod.Float16, Shape: []int{n}}
				x.Data = make([]byte, 2*n)
				for i, h := range v {
					binary.LittleEndian.PutUint16(x.Data[2*i:], h)
				}
			}
			if err != nil {
				log.Fatal(err)
			}
			named = append(named, horovod.NamedTensor{Name: fmt.Sprintf("adasum/%v/%d", check.dt, k), Tensor: x})
		}
		if results[c], err = hvd.GroupedAllreduce(named, horovod.AllreduceOptions{Op: horovod.Adasum}); err != nil {
			log.Fatal(err)
		}
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
	failed := false
	for c, check := range adasumChecks {
		es := check.dt.Size()
		worst, where := 0.0, ""
		for k, r := range results[c] {
			if len(theirs) < len(r.Data) {
				log.Fatalf("%s: fewer bytes than the %v results of %d tensors", horovodFile, check.dt, len(adasumLengths))
			}
			for i := range len(r.Data) / es {
				ours, hv := adasumElement(check.dt, r.Data[i*es:]), adasumElement(check.dt, theirs[i*es:])
				if d := math.Abs(ours-hv) / (1 + math.Abs(hv)); !(d <= worst) {
					worst, where = d, fmt.Sprintf("tensor %d element %d: gorovod %v, Horovod %v", k, i, ours, hv)
				}
			}
			theirs = theirs[len(r.Data):]
		}
		fmt.Printf("Adasum on %d ranks, %d %v tensors: largest difference from Horovod's %.2g (%s)\n", size, len(adasumLengths), check.dt, worst, where)
		if !(worst <= check.tolerance) {
			log.Printf("Adasum of %v differs from Horovod's by more than %g", check.dt, check.tolerance)
			failed = true
		}
	}
	if len(theirs) != 0 {
		log.Fatalf("%s: %d bytes more than the results", horovodFile, len(theirs))
	}
	if failed {
		os.Exit(1)
	}
}

// adasumElement decodes the first element of b, little-endian, of dtype dt.
func adasumElement(dt horovod.DType, b []byte) float64 {
	if dt == horovod.Float16 {
		return fp16.ToFloat64(binary.LittleEndian.Uint16(b))
	}
	return float64(math.Float32frombits(binary.LittleEndian.Uint32(b)))
}
