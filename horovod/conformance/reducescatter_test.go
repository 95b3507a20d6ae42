package conformance

import (
	"bytes"
	"fmt"
	"math"
	"os"
	"strconv"
	"testing"

	"github.com/gorovod/gorovod/horovod"
	"github.com/gorovod/gorovod/horovod/backend"
	"github.com/gorovod/gorovod/horovod/internal/rawmpi"
	"github.com/gorovod/gorovod/horovod/mpi"
)

// scatterBlock is the first row and the number of rows of rank's block of a reducescatter of rows
// rows over size ranks, as Horovod splits them: rows/size each, one more on the first rows%size
// ranks. Written out here from Horovod's definition, so that a wrong split in package horovod
// cannot agree with it.
func scatterBlock(rows, size, rank int) (first, n int) {
	for r := 0; r <= rank; r++ {
		first += n
		n = rows / size
		if r < rows%size {
			n++
		}
	}
	return first, n
}

// reducescatterInput is rank r's tensor of n elements: 2(r+1)c with c = i%13-6, so that an
// element's value tells its position within 13 (a block taken from the wrong rows has other
// values), and the sum (c·size·(size+1)), the average (c·(size+1)), the min and the max are
// exact in every dtype. Prescaled by 3, the partial sums stay even integers below 512 up to
// size 4: exact in bfloat16 too.
func reducescatterInput(rank, n int) (vals, cs []float64) {
	vals, cs = make([]float64, n), make([]float64, n)
	for i := range vals {
		cs[i] = float64(i%13 - 6)
		vals[i] = 2 * float64(rank+1) * cs[i]
	}
	return vals, cs
}

// reducescatterCase is one reducescatter of TestReducescatterExact: its options, and the
// reduction of element c's position that every rank's input makes.
type reducescatterCase struct {
	o    horovod.ReducescatterOptions
	want func(c, size float64) float64
}

var reducescatterCases = []reducescatterCase{
	{horovod.ReducescatterOptions{Op: horovod.Sum}, func(c, s float64) float64 { return c * s * (s + 1) }},
	{horovod.ReducescatterOptions{Op: horovod.Average}, func(c, s float64) float64 { return c * (s + 1) }},
	{horovod.ReducescatterOptions{Op: horovod.Min}, func(c, s float64) float64 { return math.Min(2*c, 2*c*s) }},
	{horovod.ReducescatterOptions{Op: horovod.Max}, func(c, s float64) float64 { return math.Max(2*c, 2*c*s) }},
	// Σ 3·2(r+1)c · 0.5 = 1.5·c·size·(size+1), an integer: size·(size+1) is even.
	{horovod.ReducescatterOptions{Op: horovod.Sum, Prescale: 3, Postscale: 0.5}, func(c, s float64) float64 { return 1.5 * c * s * (s + 1) }},
	// 1.5·c·(size+1): halves, which only the floating dtypes take (see reducescatterCaseFits).
	{horovod.ReducescatterOptions{Op: horovod.Average, Prescale: 3, Postscale: 0.5}, func(c, s float64) float64 { return 1.5 * c * (s + 1) }},
}

// reducescatterCaseFits tells whether dt holds case rc's results exactly.
func reducescatterCaseFits(dt backend.DType, rc reducescatterCase) bool {
	integer := dt == backend.Int32 || dt == backend.Int64
	return !integer || rc.o.Op != horovod.Average || rc.o.Prescale == 0
}

// reducescatterShapes: 7 rows split unevenly over 2 and 3 ranks, a 1-D tensor, fewer rows than
// ranks (the last ranks receive none), 3-D, and no rows at all.
var reducescatterShapes = [][]int{{7, 3}, {5}, {1, 4}, {2, 2, 3}, {0, 3}}

// Reducescatter leaves each rank the block of rows Horovod's split gives it, with the values
// every rank's input reduces to, computed here: every dtype, every op but Product, scaled, for
// every shape; one at a time, then each dtype's all submitted together.
func TestReducescatterExact(t *testing.T) {
	size, rank := hvd.Size(), hvd.Rank()
	for _, async := range []bool{false, true} {
		var wait []func()
		for _, dt := range reduceTypes {
			for _, shape := range reducescatterShapes {
				row := numElements(shape[1:])
				first, rows := scatterBlock(shape[0], size, rank)
				in, cs := reducescatterInput(rank, numElements(shape))
				for ci, rc := range reducescatterCases {
					if !reducescatterCaseFits(dt, rc) {
						continue
					}
					want := make([]float64, rows*row)
					for i := range want {
						want[i] = rc.want(cs[first*row+i], float64(size))
					}
					wantShape := append([]int{rows}, shape[1:]...)
					name := fmt.Sprintf("reducescatter/exact/%v/%v/%d/%v", dt, shape, ci, async)
					x := tensor(dt, shape, in)
					before := bytes.Clone(x.Data)
					h, err := hvd.ReducescatterAsync(name, x, rc.o)
					if err != nil {
						t.Fatalf("%s: %v", name, err)
					}
					check := func() {
						got, err := h.Wait()
						if err != nil {
							t.Fatalf("%s: %v", name, err)
						}
						expectValues(t, name, got, dt, wantShape, want)
						if !bytes.Equal(before, x.Data) {
							t.Errorf("%s: Reducescatter modified its input", name)
						}
						if h.ReceivedSplits() != nil {
							t.Errorf("%s: received splits %v for a reducescatter", name, h.ReceivedSplits())
						}
					}
					if async {
						wait = append(wait, check)
					} else {
						check()
					}
				}
			}
			for _, w := range wait {
				w()
			}
			wait = nil
		}
	}
	// The blocking call gives the same as the handle.
	in, cs := reducescatterInput(rank, 7*3)
	first, rows := scatterBlock(7, size, rank)
	want := make([]float64, rows*3)
	for i := range want {
		want[i] = cs[3*first+i] * float64(size*(size+1))
	}
	got, err := hvd.Reducescatter("reducescatter/blocking", tensor(backend.Float32, []int{7, 3}, in), horovod.ReducescatterOptions{Op: horovod.Sum})
	if err != nil {
		t.Fatal(err)
	}
	expectValues(t, "reducescatter/blocking", got, backend.Float32, []int{rows, 3}, want)
}

// fusedCalls is how many backend calls horovod's fusion makes of same-kind tensors of these
// sizes in bytes, in order, under the job's fusion threshold (HOROVOD_FUSION_THRESHOLD, as
// make test-mpi sets it for every rank of a run, else horovod's default): a batch starts at the
// first tensor left and takes each later one that still fits while it holds less than 256 KiB
// (horovod's directMin). Reducescatters of 256 KiB or more go alone; the tests give it none.
func fusedCalls(t *testing.T, sizes []int) uint64 {
	for _, n := range sizes {
		if n >= 256<<10 {
			t.Fatalf("fusedCalls: a reducescatter of %d bytes goes alone, which it does not count", n)
		}
	}
	threshold := horovod.DefaultFusionThreshold
	if v := os.Getenv("HOROVOD_FUSION_THRESHOLD"); v != "" {
		var err error
		if threshold, err = strconv.Atoi(v); err != nil {
			t.Fatalf("HOROVOD_FUSION_THRESHOLD=%q: %v", v, err)
		}
	}
	used := make([]bool, len(sizes))
	var calls uint64
	for i := range sizes {
		if used[i] {
			continue
		}
		calls++
		bytes := sizes[i]
		for j := i + 1; j < len(sizes) && bytes < 256<<10; j++ {
			if !used[j] && bytes+sizes[j] <= threshold {
				used[j] = true
				bytes += sizes[j]
			}
		}
	}
	return calls
}

// GroupedReducescatter of every shape of TestReducescatterExact as one group, for each dtype and
// case: each member gets its exact block, and the group is one reduce-scatter of the MPI
// backend's where it fits the fusion threshold (fused: each rank's fused block holds its block
// of every member, an empty one included).
func TestGroupedReducescatterExact(t *testing.T) {
	size, rank := hvd.Size(), hvd.Rank()
	for _, dt := range reduceTypes {
		for ci, rc := range reducescatterCases {
			if !reducescatterCaseFits(dt, rc) {
				continue
			}
			members := make([]horovod.NamedTensor, len(reducescatterShapes))
			wants := make([][]float64, len(reducescatterShapes))
			sizes := make([]int, len(reducescatterShapes))
			for m, shape := range reducescatterShapes {
				row := numElements(shape[1:])
				first, rows := scatterBlock(shape[0], size, rank)
				in, cs := reducescatterInput(rank, numElements(shape))
				wants[m] = make([]float64, rows*row)
				for i := range wants[m] {
					wants[m][i] = rc.want(cs[first*row+i], float64(size))
				}
				members[m] = horovod.NamedTensor{Name: fmt.Sprintf("reducescatter/grouped/%v/%v/%d", dt, shape, ci), Tensor: tensor(dt, shape, in)}
				sizes[m] = len(members[m].Data)
			}
			var before uint64
			if world != nil {
				before = world.ReduceScatters()
			}
			got, err := hvd.GroupedReducescatter(members, rc.o)
			if err != nil {
				t.Fatalf("%v case %d: %v", dt, ci, err)
			}
			if world != nil {
				if n, want := world.ReduceScatters()-before, fusedCalls(t, sizes); n != want {
					t.Errorf("%v case %d: %d reduce-scatters of the MPI backend for a group of %d, want %d", dt, ci, n, len(members), want)
				}
			}
			for m, shape := range reducescatterShapes {
				_, rows := scatterBlock(shape[0], size, rank)
				expectValues(t, members[m].Name, got[m], dt, append([]int{rows}, shape[1:]...), wants[m])
			}
		}
	}
}

// rawReducescatterRows and rawReducescatterCols shape the raw MPI_Reduce_scatter references: 1001
// rows split unevenly over 2 ranks (501, 500) and over 3 (334, 334, 333).
const rawReducescatterRows, rawReducescatterCols = 1001, 3

// rawReducescatterKeys are raw's entries for MPI_Reduce_scatter of rawInput, by dtype and op
// (horovod's, and MPI's for it).
var rawReducescatterKeys = []struct {
	dt  backend.DType
	op  horovod.ReduceOp
	mpi backend.ReduceOp
}{
	{backend.Float32, horovod.Sum, backend.Sum},
	{backend.Float64, horovod.Sum, backend.Sum},
	{backend.Int32, horovod.Max, backend.Max},
	{backend.Int64, horovod.Min, backend.Min},
}

func rawReducescatterKey(dt backend.DType, op horovod.ReduceOp) string {
	return "reducescatter/" + dt.String() + "/" + op.String()
}

// rawReducescatterReferences fills raw with MPI_Reduce_scatter's results for rawInput, each rank
// receiving its block of rows by Horovod's split (see scatterBlock), before horovod starts.
func rawReducescatterReferences(comm *mpi.Comm) error {
	topo := comm.Topology()
	for _, k := range rawReducescatterKeys {
		row := rawReducescatterCols * k.dt.Size()
		counts := make([]int, topo.Size)
		for r := range counts {
			_, n := scatterBlock(rawReducescatterRows, topo.Size, r)
			counts[r] = n * row
		}
		in := rawInput(k.dt, topo.Rank, rawReducescatterRows*rawReducescatterCols)
		out := make([]byte, counts[topo.Rank])
		var err error
		comm.Do(func() { err = rawmpi.ReduceScatter(in, out, counts, k.dt, k.mpi) })
		if err != nil {
			return err
		}
		raw[rawReducescatterKey(k.dt, k.op)] = out
	}
	return nil
}

// horovod's reducescatter returns, on every rank, the bytes MPI_Reduce_scatter gives that rank
// for the same input: the inputs are integer-valued (rawInput), below 2^24 in magnitude with
// sums too, so any order of summation is exact, in float32 as well; and it is besides the same
// MPI call on the same data in the same layout of processes. It goes through the MPI backend's
// MPI_Reduce_scatter: no MPI_Allreduce call, and nothing over shared memory (the backend counts
// both).
func TestReducescatterMatchesRawMPI(t *testing.T) {
	if raw == nil {
		t.Skip("raw MPI reference needs mpirun")
	}
	for _, k := range rawReducescatterKeys {
		key := rawReducescatterKey(k.dt, k.op)
		in := horovod.Tensor{DType: k.dt, Shape: []int{rawReducescatterRows, rawReducescatterCols},
			Data: rawInput(k.dt, hvd.Rank(), rawReducescatterRows*rawReducescatterCols)}
		calls, shared := world.AllreduceCalls(), world.SharedAllreduces()
		got, err := hvd.Reducescatter(key+"/raw", in, horovod.ReducescatterOptions{Op: k.op})
		if err != nil {
			t.Fatal(err)
		}
		if n, s := world.AllreduceCalls()-calls, world.SharedAllreduces()-shared; n != 0 || s != 0 {
			t.Errorf("%s: %d MPI_Allreduce calls and %d allreduces over shared memory for a reducescatter, want none", key, n, s)
		}
		_, rows := scatterBlock(rawReducescatterRows, hvd.Size(), hvd.Rank())
		if !equalInts(got.Shape, []int{rows, rawReducescatterCols}) {
			t.Errorf("%s: shape %v, want [%d %d]", key, got.Shape, rows, rawReducescatterCols)
		}
		if !bytes.Equal(got.Data, raw[key]) {
			t.Errorf("%s: horovod's reducescatter and MPI_Reduce_scatter differ on rank %d", key, hvd.Rank())
		}
		// Two members fused: each rank's fused block is its block of one, then of the other,
		// each still the bytes MPI_Reduce_scatter gives it.
		before := world.ReduceScatters()
		group, err := hvd.GroupedReducescatter([]horovod.NamedTensor{{Name: key + "/raw/a", Tensor: in}, {Name: key + "/raw/b", Tensor: in}},
			horovod.ReducescatterOptions{Op: k.op})
		if err != nil {
			t.Fatal(err)
		}
		if n, want := world.ReduceScatters()-before, fusedCalls(t, []int{len(in.Data), len(in.Data)}); n != want {
			t.Errorf("%s: %d reduce-scatters of the MPI backend for a group of two, want %d", key, n, want)
		}
		for _, g := range group {
			if !bytes.Equal(g.Data, raw[key]) {
				t.Errorf("%s: a grouped reducescatter and MPI_Reduce_scatter differ on rank %d", key, hvd.Rank())
			}
		}
	}
}
