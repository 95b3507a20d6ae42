package conformance

import (
	"bytes"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/gorovod/gorovod/horovod"
	"github.com/gorovod/gorovod/horovod/backend"
	"github.com/gorovod/gorovod/horovod/internal/rawmpi"
	"github.com/gorovod/gorovod/horovod/mpi"
)

// splitsFunc gives the rows rank from sends rank to in a job of size ranks.
type splitsFunc func(from, to, size int) int

// alltoallSplits are the splits TestAlltoallExact sends with, by name; "even" is nil splits.
var alltoallSplits = []struct {
	name   string
	splits splitsFunc
}{
	// 0 to 2 rows, different on every rank, with empty blocks (rank 0 sends rank 1 none).
	{"uneven", func(from, to, _ int) int { return (from + 2*to + 1) % 3 }},
	// Rank 0 sends nothing (a tensor of no rows) and the last rank receives nothing.
	{"empty", func(from, to, size int) int {
		if from == 0 || to == size-1 {
			return 0
		}
		return from + to
	}},
	{"even", func(_, _, _ int) int { return 2 }},
}

// splitsOf is rank from's splits.
func splitsOf(f splitsFunc, from, size int) []int {
	s := make([]int, size)
	for to := range s {
		s[to] = f(from, to, size)
	}
	return s
}

// alltoallRow is element e of row j of rank r's tensor: it tells sender, row and element apart
// (for rows and elements below 10), exact in every dtype here.
func alltoallRow(r, j, row int) []float64 {
	v := make([]float64, row)
	for e := range v {
		v[e] = float64(100*r + 10*j + e%10)
	}
	return v
}

// alltoallExpected is rank me's tensor of rows for splits f (and the inner shape's row of
// elements), and what it receives: every rank's rows addressed to it, in rank order, and how
// many came from each rank.
func alltoallExpected(f splitsFunc, me, size, row int) (in, want []float64, received []int) {
	for j := range rowsOf(f, me, size) {
		in = append(in, alltoallRow(me, j, row)...)
	}
	for from := range size {
		first := 0 // of the rows rank from sends me
		for to := range me {
			first += f(from, to, size)
		}
		n := f(from, me, size)
		for j := first; j < first+n; j++ {
			want = append(want, alltoallRow(from, j, row)...)
		}
		received = append(received, n)
	}
	return in, want, received
}

// rowsOf is the number of rows in rank from's tensor: all it sends.
func rowsOf(f splitsFunc, from, size int) int {
	n := 0
	for to := range size {
		n += f(from, to, size)
	}
	return n
}

// Alltoall gives each rank the rows every rank addressed to it, in rank order, and says how many
// came from each, computed here from every rank's splits: uneven splits that differ by rank,
// empty blocks, a rank that sends nothing and one that receives nothing, nil (even) splits;
// 1-D, 2-D and 3-D tensors; blocking and through the handle.
func TestAlltoallExact(t *testing.T) {
	size, rank := hvd.Size(), hvd.Rank()
	for _, dt := range []backend.DType{backend.Int64, backend.Float32, backend.Float16} {
		for _, sp := range alltoallSplits {
			for _, inner := range [][]int{{}, {2}, {2, 3}} {
				row := numElements(inner)
				in, want, received := alltoallExpected(sp.splits, rank, size, row)
				rows := len(in) / row
				x := tensor(dt, append([]int{rows}, inner...), in)
				before := bytes.Clone(x.Data)
				var splits []int
				if sp.name != "even" {
					splits = splitsOf(sp.splits, rank, size)
				}
				wantShape := append([]int{len(want) / row}, inner...)
				name := fmt.Sprintf("alltoall/exact/%v/%s/%v", dt, sp.name, inner)
				got, gotReceived, err := hvd.Alltoall(name, x, splits)
				if err != nil {
					t.Fatalf("%s: %v", name, err)
				}
				expectValues(t, name, got, dt, wantShape, want)
				if !slices.Equal(gotReceived, received) {
					t.Errorf("%s: received splits %v, want %v", name, gotReceived, received)
				}
				h, err := hvd.AlltoallAsync(name+"/async", x, splits)
				if err != nil {
					t.Fatalf("%s/async: %v", name, err)
				}
				got, err = h.Wait()
				if err != nil {
					t.Fatalf("%s/async: %v", name, err)
				}
				expectValues(t, name+"/async", got, dt, wantShape, want)
				if !slices.Equal(h.ReceivedSplits(), received) {
					t.Errorf("%s/async: received splits %v, want %v", name, h.ReceivedSplits(), received)
				}
				if !bytes.Equal(before, x.Data) {
					t.Errorf("%s: Alltoall modified its input", name)
				}
			}
		}
	}
}

// rawAlltoallSplits are the splits of the raw MPI_Alltoallv reference, in rows of
// rawAlltoallCols int64 elements: 0, 37 or 74 rows, with empty blocks.
func rawAlltoallSplits(from, to, _ int) int { return 37 * ((from + 2*to + 1) % 3) }

const rawAlltoallCols = 3

const rawAlltoallKey = "alltoall"

// rawAlltoallInput is rank's tensor of the raw reference: its rows for every rank, rawInput's
// int64 values.
func rawAlltoallInput(rank, size int) horovod.Tensor {
	rows := rowsOf(rawAlltoallSplits, rank, size)
	return horovod.Tensor{DType: backend.Int64, Shape: []int{rows, rawAlltoallCols},
		Data: rawInput(backend.Int64, rank, rows*rawAlltoallCols)}
}

// rawAlltoallReference fills raw with MPI_Alltoallv's result of rawAlltoallInput, before horovod
// starts.
func rawAlltoallReference(comm *mpi.Comm) error {
	topo := comm.Topology()
	in := rawAlltoallInput(topo.Rank, topo.Size)
	row := rawAlltoallCols * backend.Int64.Size()
	sendCounts, recvCounts := make([]int, topo.Size), make([]int, topo.Size)
	total := 0
	for r := range topo.Size {
		sendCounts[r] = rawAlltoallSplits(topo.Rank, r, topo.Size) * row
		recvCounts[r] = rawAlltoallSplits(r, topo.Rank, topo.Size) * row
		total += recvCounts[r]
	}
	out := make([]byte, total)
	var err error
	comm.Do(func() { err = rawmpi.Alltoallv(in.Data, sendCounts, out, recvCounts) })
	raw[rawAlltoallKey] = out
	return err
}

// horovod's alltoall returns, on every rank, the bytes MPI_Alltoallv gives that rank for the same
// tensors and splits, and its received splits are the rows of each rank's block.
func TestAlltoallMatchesRawMPI(t *testing.T) {
	if raw == nil {
		t.Skip("raw MPI reference needs mpirun")
	}
	size, rank := hvd.Size(), hvd.Rank()
	got, received, err := hvd.Alltoall("alltoall/raw", rawAlltoallInput(rank, size), splitsOf(rawAlltoallSplits, rank, size))
	if err != nil {
		t.Fatal(err)
	}
	want := make([]int, size)
	for r := range want {
		want[r] = rawAlltoallSplits(r, rank, size)
	}
	if !slices.Equal(received, want) {
		t.Errorf("received splits %v, want %v", received, want)
	}
	if !bytes.Equal(got.Data, raw[rawAlltoallKey]) {
		t.Errorf("horovod's alltoall and MPI_Alltoallv differ on rank %d", rank)
	}
}

// Disagreements about a reducescatter or an alltoall fail it on every rank with the same error,
// naming what each rank said; the job goes on.
func TestReducescatterAndAlltoallErrors(t *testing.T) {
	if hvd.Size() < 2 {
		t.Skip("disagreements need at least two ranks")
	}
	size, rank, last := hvd.Size(), hvd.Rank(), hvd.Size()-1
	t.Run("reducescatter shape mismatch", func(t *testing.T) {
		shape := []int{2, 3}
		if rank == last {
			shape = []int{3, 2}
		}
		_, err := hvd.Reducescatter("reducescatter/bad/shape", tensor(backend.Float32, shape, make([]float64, 6)), horovod.ReducescatterOptions{})
		expectSameError(t, "reducescatter shape", err, `reducescatter "reducescatter/bad/shape"`, "mismatched shapes",
			"[2 3] "+onRanks(allButLast()...), "[3 2] "+onRanks(last))
	})
	t.Run("reducescatter op mismatch", func(t *testing.T) {
		op := horovod.Sum
		if rank == 0 {
			op = horovod.Max
		}
		_, err := hvd.Reducescatter("reducescatter/bad/op", tensor(backend.Int32, []int{4}, make([]float64, 4)), horovod.ReducescatterOptions{Op: op})
		expectSameError(t, "reducescatter op", err, `reducescatter "reducescatter/bad/op"`, "mismatched reduce ops", "max on rank 0", "sum on rank")
	})
	t.Run("alltoall shapes beyond the first dimension", func(t *testing.T) {
		// Rank r sends r+1 rows to every rank: first dimensions that differ are fine, the rest
		// must agree.
		inner := 2
		if rank == last {
			inner = 3
		}
		rows := (rank + 1) * size
		_, _, err := hvd.Alltoall("alltoall/bad/shape", tensor(backend.Int64, []int{rows, inner}, make([]float64, rows*inner)), slices.Repeat([]int{rank + 1}, size))
		expectSameError(t, "alltoall shape", err, `alltoall "alltoall/bad/shape"`, "mismatched shapes beyond the first dimension",
			"[2] "+onRanks(allButLast()...), "[3] "+onRanks(last))
	})
	t.Run("alltoall dtype mismatch", func(t *testing.T) {
		dt := backend.Float32
		if rank == 0 {
			dt = backend.Float64
		}
		_, _, err := hvd.Alltoall("alltoall/bad/dtype", tensor(dt, []int{size}, make([]float64, size)), nil)
		expectSameError(t, "alltoall dtype", err, `alltoall "alltoall/bad/dtype"`, "mismatched data types", "float64 on rank 0", "float32 on rank")
	})
	// After all of that the job still works.
	if err := hvd.Barrier(); err != nil {
		t.Fatal(err)
	}
}

// While the last rank has joined, an alltoall fails on the others, naming it (it would receive
// rows it never asked for, and send none: Horovod refuses it too), and a reducescatter takes its
// zeros, as an allreduce does; then the others join, and Join returns everywhere.
func TestAlltoallWhileARankHasJoined(t *testing.T) {
	if hvd.Size() < 2 {
		t.Skip("joining needs at least two ranks")
	}
	size, rank, last := hvd.Size(), hvd.Rank(), hvd.Size()-1
	var lastJoined int
	var err error
	if rank == last {
		lastJoined, err = hvd.Join()
	} else {
		_, _, aerr := hvd.Alltoall("alltoall/joined", tensor(backend.Int64, []int{size, 2}, make([]float64, 2*size)), nil)
		var he *horovod.Error
		if !errors.As(aerr, &he) {
			t.Errorf("alltoall with rank %d joined: want a *horovod.Error, got %v", last, aerr)
		} else {
			for _, f := range []string{`alltoall "alltoall/joined"`, "Join", "rank(s) " + strconv.Itoa(last) + " have joined"} {
				if !strings.Contains(aerr.Error(), f) {
					t.Errorf("alltoall with rank %d joined: %q lacks %q", last, aerr, f)
				}
			}
		}

		in, cs := reducescatterInput(rank, 7*2)
		first, rows := scatterBlock(7, size, rank)
		want := make([]float64, rows*2)
		for i := range want {
			// Σ over the ranks but the last of 2(r+1)c: the joined rank's zeros add nothing.
			want[i] = cs[2*first+i] * float64(last*(last+1))
		}
		got, rerr := hvd.Reducescatter("reducescatter/joined", tensor(backend.Int32, []int{7, 2}, in), horovod.ReducescatterOptions{Op: horovod.Sum})
		if rerr != nil {
			t.Errorf("reducescatter with rank %d joined: %v", last, rerr)
		} else {
			expectValues(t, "reducescatter/joined", got, backend.Int32, []int{rows, 2}, want)
		}
		lastJoined, err = hvd.Join()
	}
	if err != nil {
		t.Fatal(err)
	}
	if lastJoined < 0 || lastJoined >= last {
		t.Errorf("the last rank to join was %d, but rank %d joined first", lastJoined, last)
	}
	sameOnEveryRank(t, "alltoall/joined/last", strconv.Itoa(lastJoined))
}
