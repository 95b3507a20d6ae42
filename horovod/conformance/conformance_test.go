package conformance

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"reflect"
	"runtime/debug"
	"strconv"
	"strings"
	"testing"

	"github.com/gorovod/gorovod/horovod"
	"github.com/gorovod/gorovod/horovod/backend"
	"github.com/gorovod/gorovod/horovod/fp16"
	"github.com/gorovod/gorovod/horovod/mpi"
)

var (
	reduceTypes = []backend.DType{backend.Int32, backend.Int64, backend.Float16, backend.BFloat16, backend.Float32, backend.Float64}
	shapes      = [][]int{{17}, {3, 5}, {2, 3, 4}}
)

// allreduceInput is rank r's tensor: 2(r+1)k with k cycling through -3..3, so that the sum
// (k·size·(size+1)), the average (k·(size+1)), the min, the max and the product ((2k)^size·size!)
// are exact in every dtype.
func allreduceInput(rank, n int) (vals, ks []float64) {
	vals, ks = make([]float64, n), make([]float64, n)
	for i := range vals {
		ks[i] = float64(i%7 - 3)
		vals[i] = 2 * float64(rank+1) * ks[i]
	}
	return vals, ks
}

func TestAllreduceExact(t *testing.T) {
	size := float64(hvd.Size())
	for _, dt := range reduceTypes {
		for _, shape := range shapes {
			n := numElements(shape)
			in, ks := allreduceInput(hvd.Rank(), n)
			for _, op := range []horovod.ReduceOp{horovod.Sum, horovod.Average, horovod.Min, horovod.Max, horovod.Product} {
				want := make([]float64, n)
				for i, k := range ks {
					switch op {
					case horovod.Sum:
						want[i] = k * size * (size + 1)
					case horovod.Average:
						want[i] = k * (size + 1)
					case horovod.Min:
						want[i] = math.Min(2*k, 2*k*size)
					case horovod.Max:
						want[i] = math.Max(2*k, 2*k*size)
					case horovod.Product:
						want[i] = math.Pow(2*k, size) * math.Gamma(size+1)
					}
				}
				name := fmt.Sprintf("exact/%v/%v/%v", dt, shape, op)
				got, err := hvd.Allreduce(name, tensor(dt, shape, in), horovod.AllreduceOptions{Op: op})
				if err != nil {
					t.Fatalf("%s: %v", name, err)
				}
				expectValues(t, name, got, dt, shape, want)
			}
		}
	}
}

// Many tensors submitted together fuse (per dtype) and still come back exact, async and grouped.
func TestFusedAndGroupedAllreduce(t *testing.T) {
	size := float64(hvd.Size())
	var handles []*horovod.Handle
	var wants [][]float64
	var named []horovod.NamedTensor
	for i := 0; i < 24; i++ {
		dt := reduceTypes[i%len(reduceTypes)]
		shape := shapes[i%len(shapes)]
		in, ks := allreduceInput(hvd.Rank(), numElements(shape))
		want := make([]float64, len(ks))
		for j, k := range ks {
			want[j] = k * size * (size + 1)
		}
		x := tensor(dt, shape, in)
		h, err := hvd.AllreduceAsync(fmt.Sprintf("fused/%d", i), x, horovod.AllreduceOptions{Op: horovod.Sum})
		if err != nil {
			t.Fatal(err)
		}
		handles = append(handles, h)
		wants = append(wants, want)
		named = append(named, horovod.NamedTensor{Name: fmt.Sprintf("grouped/%d", i), Tensor: x})
	}
	for i, h := range handles {
		got, err := h.Wait()
		if err != nil {
			t.Fatal(err)
		}
		expectValues(t, fmt.Sprintf("fused/%d", i), got, named[i].DType, named[i].Shape, wants[i])
	}
	outs, err := hvd.GroupedAllreduce(named, horovod.AllreduceOptions{Op: horovod.Sum})
	if err != nil {
		t.Fatal(err)
	}
	for i, got := range outs {
		expectValues(t, named[i].Name, got, named[i].DType, named[i].Shape, wants[i])
	}
}

func TestPrescalePostscale(t *testing.T) {
	size := float64(hvd.Size())
	for _, dt := range reduceTypes {
		in, ks := allreduceInput(hvd.Rank(), 12)
		want := make([]float64, len(ks))
		for i, k := range ks {
			// Σ 3·2(r+1)k · 0.5 = 1.5·k·size·(size+1), an integer: size·(size+1) is even.
			want[i] = 1.5 * k * size * (size + 1)
		}
		got, err := hvd.Allreduce("scaled/"+dt.String(), tensor(dt, []int{12}, in), horovod.AllreduceOptions{Op: horovod.Sum, Prescale: 3, Postscale: 0.5})
		if err != nil {
			t.Fatal(err)
		}
		expectValues(t, "scaled/"+dt.String(), got, dt, []int{12}, want)
	}
}

func TestAllgatherVariableFirstDimension(t *testing.T) {
	// One tensor at a time, then every dtype's submitted together (fused where a round sees them
	// all at once), then each dtype's as one GroupedAllgather.
	for _, mode := range []string{"one", "async", "grouped"} {
		var wait []func()
		for _, dt := range backend.DTypes {
			wait = append(wait, allgatherVariableFirstDimension(t, dt, mode)...)
		}
		for _, w := range wait {
			w()
		}
	}
}

// allgatherVariableFirstDimension gathers a tensor of dt per inner shape, rank r sending r+1 rows,
// and checks each result: one at a time (mode "one"), submitted together with the checks returned
// to run after submitting more ("async"), or as one group ("grouped").
func allgatherVariableFirstDimension(t *testing.T, dt backend.DType, mode string) []func() {
	var members []horovod.NamedTensor
	var wantShapes [][]int
	var wants [][]float64
	for _, inner := range [][]int{{}, {3}, {2, 2}} {
		shape := append([]int{hvd.Rank() + 1}, inner...)
		row := numElements(inner)
		in := make([]float64, numElements(shape))
		for i := range in {
			in[i] = float64(10*hvd.Rank() + i%10)
		}
		var want []float64
		rows := 0
		for r := 0; r < hvd.Size(); r++ {
			for i := 0; i < (r+1)*row; i++ {
				want = append(want, float64(10*r+i%10))
			}
			rows += r + 1
		}
		members = append(members, horovod.NamedTensor{Name: fmt.Sprintf("gather/%v/%v/%v", dt, inner, mode), Tensor: tensor(dt, shape, in)})
		wantShapes, wants = append(wantShapes, append([]int{rows}, inner...)), append(wants, want)
	}
	if mode == "grouped" {
		got, err := hvd.GroupedAllgather(members)
		if err != nil {
			t.Fatalf("grouped allgather of %v: %v", dt, err)
		}
		for i, m := range members {
			expectValues(t, m.Name, got[i], dt, wantShapes[i], wants[i])
		}
		return nil
	}
	var wait []func()
	for i, m := range members {
		hd, err := hvd.AllgatherAsync(m.Name, m.Tensor)
		if err != nil {
			t.Fatalf("%s: %v", m.Name, err)
		}
		check := func() {
			got, err := hd.Wait()
			if err != nil {
				t.Fatalf("%s: %v", m.Name, err)
			}
			expectValues(t, m.Name, got, dt, wantShapes[i], wants[i])
		}
		if mode == "async" {
			wait = append(wait, check)
		} else {
			check()
		}
	}
	return wait
}

func TestBroadcastEveryDtypeFromEveryRoot(t *testing.T) {
	for root := 0; root < hvd.Size(); root++ {
		for _, dt := range backend.DTypes {
			shape := []int{3, 5}
			mine := make([]float64, 15)
			want := make([]float64, 15)
			for i := range mine {
				mine[i] = float64((hvd.Rank()*31 + i) % 100)
				want[i] = float64((root*31 + i) % 100)
			}
			x := tensor(dt, shape, mine)
			before := append([]byte(nil), x.Data...)
			name := fmt.Sprintf("bcast/%d/%v", root, dt)
			got, err := hvd.Broadcast(name, x, root)
			if err != nil {
				t.Fatalf("%s: %v", name, err)
			}
			expectValues(t, name, got, dt, shape, want)
			if string(before) != string(x.Data) {
				t.Errorf("%s: Broadcast modified its input", name)
			}
		}
	}
	// Large enough for MPI's rendezvous protocol, where the receivers read the root's input
	// while the root copies it into its result: the backend must only read the root's buffer.
	for root := 0; root < hvd.Size(); root++ {
		const n = 1 << 17 // 512 KiB of float32
		mine := make([]float64, n)
		want := make([]float64, n)
		for i := range mine {
			mine[i] = float64((hvd.Rank()*31 + i) % 1000)
			want[i] = float64((root*31 + i) % 1000)
		}
		x := tensor(backend.Float32, []int{n}, mine)
		before := append([]byte(nil), x.Data...)
		name := fmt.Sprintf("bcast/large/%d", root)
		got, err := hvd.Broadcast(name, x, root)
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		expectValues(t, name, got, backend.Float32, []int{n}, want)
		if string(before) != string(x.Data) {
			t.Errorf("%s: Broadcast modified its input", name)
		}
		if &got.Data[0] == &x.Data[0] {
			t.Errorf("%s: the result is the input", name)
		}
	}
	// In place, for the initial weights.
	vars := []horovod.NamedTensor{
		{Name: "kernel", Tensor: tensor(backend.Float32, []int{2, 2}, []float64{float64(hvd.Rank()), 1, 2, 3})},
		{Name: "step", Tensor: tensor(backend.Int64, nil, []float64{float64(100 + hvd.Rank())})},
	}
	if err := hvd.BroadcastVariables(vars, hvd.Size()-1); err != nil {
		t.Fatal(err)
	}
	expectValues(t, "kernel", vars[0].Tensor, backend.Float32, []int{2, 2}, []float64{float64(hvd.Size() - 1), 1, 2, 3})
	expectValues(t, "step", vars[1].Tensor, backend.Int64, nil, []float64{float64(100 + hvd.Size() - 1)})

	// Every dtype's variable sliced back to back from one buffer, as one fused broadcast fills
	// them where they lie, from each root in turn.
	for root := 0; root < hvd.Size(); root++ {
		var flat []byte
		for _, dt := range backend.DTypes {
			flat = append(flat, tensor(dt, []int{7}, seq(hvd.Rank(), 7)).Data...)
		}
		vars := []horovod.NamedTensor{}
		off := 0
		for _, dt := range backend.DTypes {
			n := 7 * dt.Size()
			vars = append(vars, horovod.NamedTensor{Name: fmt.Sprintf("flat/%d/%v", root, dt),
				Tensor: horovod.Tensor{DType: dt, Shape: []int{7}, Data: flat[off : off+n : off+n]}})
			off += n
		}
		if err := hvd.BroadcastVariables(vars, root); err != nil {
			t.Fatal(err)
		}
		for _, v := range vars {
			expectValues(t, v.Name, v.Tensor, v.DType, []int{7}, seq(root, 7))
		}
	}
}

// seq is n small integers that depend on rank, exact in every dtype.
func seq(rank, n int) []float64 {
	v := make([]float64, n)
	for i := range v {
		v[i] = float64((rank*13 + i) % 50)
	}
	return v
}

// The reducer's fp16 compression: exactly representable gradients come back exact; others come
// back as the average of their float16 roundings, within the rounding of a float16 sum.
func TestFP16CompressionRoundTrip(t *testing.T) {
	size := float64(hvd.Size())
	red, err := hvd.NewReducer(horovod.ReducerOptions{Compression: horovod.FP16Compression})
	if err != nil {
		t.Fatal(err)
	}
	exact := make([]float64, 64)
	inexact := make([]float64, 64)
	wantExact := make([]float64, 64)
	wantInexact := make([]float64, 64)
	// Each of the Size-1 additions of the float16 sum rounds a partial sum, at most sumAbs in
	// magnitude, to float16 (2^-11 relative, after float32's 2^-24 for the widened add); the sum is
	// then divided by Size. Bounding by the result instead fails where the ranks' values cancel.
	sumAbs := make([]float64, 64)
	for i := range exact {
		exact[i] = float64(hvd.Rank()+1) * float64(i-32) / 8 // multiples of 1/8: exact in float16
		wantExact[i] = (size + 1) / 2 * float64(i-32) / 8
		for r := 0; r < hvd.Size(); r++ {
			h := float64(fp16.ToFloat32(fp16.FromFloat64(inexactValue(r, i))))
			wantInexact[i] += h / size
			sumAbs[i] += math.Abs(h)
		}
		inexact[i] = inexactValue(hvd.Rank(), i)
	}
	for step := 0; step < 2; step++ {
		out, ready, err := red.Reduce([]horovod.NamedTensor{
			{Name: "exact32", Tensor: tensor(backend.Float32, []int{8, 8}, exact)},
			{Name: "exact64", Tensor: tensor(backend.Float64, []int{64}, exact)},
			{Name: "inexact", Tensor: tensor(backend.Float32, []int{64}, inexact)},
			{Name: "ints", Tensor: tensor(backend.Int32, []int{64}, exact)}, // truncated: i-32 over 8
		})
		if err != nil || !ready {
			t.Fatalf("step %d: ready=%v err=%v", step, ready, err)
		}
		expectValues(t, "exact32", out[0].Tensor, backend.Float32, []int{8, 8}, wantExact)
		expectValues(t, "exact64", out[1].Tensor, backend.Float64, []int{64}, wantExact)
		for i, v := range decode(out[2].Tensor) {
			tol := (size-1)/size*(0x1p-11+0x1p-24)*sumAbs[i] + 0x1p-24*math.Abs(wantInexact[i])
			if math.Abs(v-wantInexact[i]) > tol {
				t.Errorf("inexact[%d] = %v, want %v ± %v", i, v, wantInexact[i], tol)
			}
		}
		if out[3].DType != backend.Int32 {
			t.Errorf("integer gradient came back as %v", out[3].DType)
		}
	}
}

func inexactValue(rank, i int) float64 { return math.Sin(float64(rank*64+i)) * 3.3 }

// A Reducer's 16-bit wire copies lie in the MPI backend's shared memory on one machine, and their
// sum (float16 and bfloat16 alike, from SharedAllreduceMinBytes up) goes over it where they lie:
// counted by the backend, no MPI_Allreduce; on several machines one MPI_Allreduce. Multiples of
// 1/8 below 64, summed: exact in both types.
func TestCompressedGradientsSumOverSharedMemory(t *testing.T) {
	n := mpi.SharedAllreduceMinBytes/2 + 8 // float32 elements: just over the least length as 16 bits
	grad := make([]float64, n)
	want := make([]float64, n)
	for i := range grad {
		grad[i] = float64((hvd.Rank()*13+i)%50) / 8
		for r := range hvd.Size() {
			want[i] += float64((r*13+i)%50) / 8
		}
	}
	calls, shared := uint64(1), uint64(0) // on several machines (the hostnames raw MPI gathered)
	if world != nil && len(ranksPerHost(hosts)) == 1 && hvd.Size() > 1 {
		calls, shared = 0, 1
	}
	for _, c := range []horovod.Compression{horovod.FP16Compression, horovod.BF16Compression} {
		red, err := hvd.NewReducer(horovod.ReducerOptions{Op: horovod.Sum, Compression: c})
		if err != nil {
			t.Fatal(err)
		}
		var before, sharedBefore uint64
		if world != nil {
			before, sharedBefore = world.AllreduceCalls(), world.SharedAllreduces()
		}
		out, ready, err := red.Reduce([]horovod.NamedTensor{{Name: "compressed", Tensor: tensor(backend.Float32, []int{n}, grad)}})
		if err != nil || !ready {
			t.Fatalf("%v: ready=%v err=%v", c, ready, err)
		}
		if world != nil {
			if got, s := world.AllreduceCalls()-before, world.SharedAllreduces()-sharedBefore; got != calls || s != shared {
				t.Errorf("%v: %d MPI_Allreduce calls and %d over shared memory for %d bytes on the wire, want %d and %d", c, got, s, 2*n, calls, shared)
			}
		}
		expectValues(t, fmt.Sprint(c), out[0].Tensor, backend.Float32, []int{n}, want)
		if err := red.Close(); err != nil {
			t.Fatal(err)
		}
	}
}

// expectSameError checks that err is a horovod.Error carrying all the fragments, identical on
// every rank.
func expectSameError(t *testing.T, what string, err error, fragments ...string) {
	t.Helper()
	var he *horovod.Error
	if !errors.As(err, &he) {
		t.Errorf("%s: want a *horovod.Error, got %v", what, err)
		sameOnEveryRank(t, what+"/msg", "no error")
		return
	}
	for _, f := range fragments {
		if !strings.Contains(err.Error(), f) {
			t.Errorf("%s: %q lacks %q", what, err, f)
		}
	}
	sameOnEveryRank(t, what+"/msg", err.Error())
}

func TestErrorsAreIdenticalOnEveryRank(t *testing.T) {
	if hvd.Size() < 2 {
		t.Skip("disagreements need at least two ranks")
	}
	last := strconv.Itoa(hvd.Size() - 1)
	t.Run("shape mismatch", func(t *testing.T) {
		shape := []int{2, 3}
		if hvd.Rank() == hvd.Size()-1 {
			shape = []int{3, 2}
		}
		_, err := hvd.Allreduce("bad/shape", tensor(backend.Float32, shape, make([]float64, 6)), horovod.AllreduceOptions{})
		expectSameError(t, "shape", err, `allreduce "bad/shape"`, "mismatched shapes", "[3 2] on rank "+last)
	})
	t.Run("dtype mismatch", func(t *testing.T) {
		dt := backend.Float32
		if hvd.Rank() == 0 {
			dt = backend.Float64
		}
		_, err := hvd.Allreduce("bad/dtype", tensor(dt, []int{4}, make([]float64, 4)), horovod.AllreduceOptions{})
		expectSameError(t, "dtype", err, `allreduce "bad/dtype"`, "mismatched data types", "float64 on rank 0", "float32 on rank")
	})
	t.Run("different broadcast roots", func(t *testing.T) {
		_, err := hvd.Broadcast("bad/root", tensor(backend.Int32, []int{4}, make([]float64, 4)), hvd.Rank())
		expectSameError(t, "root", err, `broadcast "bad/root"`, "mismatched root ranks", "0 on rank 0", "1 on rank 1")
	})
	// The duplicate is refused only while the first "dup" is in flight, so every rank but the last
	// checks it before the last rank has submitted "dup" at all (the gate holds that rank back):
	// a rank checking after every rank had submitted could see its first "dup" already done under
	// load, and its second submission would then be a new operation no peer matches.
	t.Run("duplicate names in flight", func(t *testing.T) {
		late := hvd.Rank() == hvd.Size()-1
		gate := func() {
			if _, err := hvd.Allreduce("dup/gate", tensor(backend.Int32, []int{1}, []float64{1}), horovod.AllreduceOptions{}); err != nil {
				t.Fatal(err)
			}
		}
		if late {
			gate()
		}
		x := tensor(backend.Int64, []int{2}, []float64{1, float64(hvd.Rank())})
		first, err := hvd.AllreduceAsync("dup", x, horovod.AllreduceOptions{Op: horovod.Sum})
		if err != nil {
			t.Fatal(err)
		}
		if !late {
			_, err = hvd.AllreduceAsync("dup", x, horovod.AllreduceOptions{Op: horovod.Sum})
			if err == nil || !strings.Contains(err.Error(), `allreduce "dup": duplicate name`) {
				t.Errorf("second submission of a name in flight: %v", err)
			}
			gate()
		}
		got, err := first.Wait()
		if err != nil {
			t.Fatal(err)
		}
		s := float64(hvd.Size())
		expectValues(t, "dup", got, backend.Int64, []int{2}, []float64{s, s * (s - 1) / 2})
	})
	// After all of that the job still works.
	if err := hvd.Barrier(); err != nil {
		t.Fatal(err)
	}
}

// horovod's allreduce returns exactly what MPI_Allreduce computes on the same data, alone and
// when the same data goes through a fusion buffer in pieces.
func TestMatchesRawMPI(t *testing.T) {
	if raw == nil {
		t.Skip("raw MPI reference needs mpirun")
	}
	for _, dt := range []backend.DType{backend.Int32, backend.Int64, backend.Float32, backend.Float64} {
		for _, op := range []horovod.ReduceOp{horovod.Sum, horovod.Min, horovod.Max, horovod.Product} {
			key := dt.String() + "/" + op.String()
			in := rawInput(dt, hvd.Rank(), rawN)
			whole, err := hvd.Allreduce("raw/"+key, horovod.Tensor{DType: dt, Shape: []int{rawN}, Data: in}, horovod.AllreduceOptions{Op: op})
			if err != nil {
				t.Fatal(err)
			}
			if string(whole.Data) != string(raw[key]) {
				t.Errorf("%s: horovod and MPI_Allreduce differ", key)
			}
			pieces := make([]horovod.NamedTensor, 10)
			per := len(in) / 10
			for i := range pieces {
				pieces[i] = horovod.NamedTensor{Name: fmt.Sprintf("raw/%s/%d", key, i), Tensor: horovod.Tensor{DType: dt, Shape: []int{per / dt.Size()}, Data: in[i*per : (i+1)*per]}}
			}
			outs, err := hvd.GroupedAllreduce(pieces, horovod.AllreduceOptions{Op: op})
			if err != nil {
				t.Fatal(err)
			}
			var joined []byte
			for _, o := range outs {
				joined = append(joined, o.Data...)
			}
			if string(joined) != string(raw[key]) {
				t.Errorf("%s: fused horovod and MPI_Allreduce differ", key)
			}
		}
	}
}

// TestLargeAllreduceInChunksMatchesOneMPICall: horovod's allreduce of a tensor longer than the
// MPI backend's chunk gives the bytes of one MPI_Allreduce over the whole tensor (integer-valued
// floats: exact in any order), into a new result and into a caller's Output, whichever way the
// backend takes, counted: on one machine, Go memory shorter than StagedAllreduceMinBytes (as
// this tensor is) goes through MPI in calls of the chunk, a longer one over shared memory in
// parts of SharedAllreducePart (staged), with no MPI_Allreduce; on several machines one
// MPI_Allreduce.
func TestLargeAllreduceInChunksMatchesOneMPICall(t *testing.T) {
	if raw == nil {
		t.Skip("raw MPI reference needs mpirun")
	}
	in := horovod.Tensor{DType: backend.Float32, Shape: []int{largeN}, Data: rawInput(backend.Float32, hvd.Rank(), largeN)}
	calls, shared := uint64(1), uint64(0) // on several machines (the hostnames raw MPI gathered)
	if len(ranksPerHost(hosts)) == 1 && hvd.Size() > 1 {
		if len(in.Data) >= mpi.StagedAllreduceMinBytes {
			calls, shared = 0, uint64((len(in.Data)+mpi.SharedAllreducePart-1)/mpi.SharedAllreducePart)
		} else {
			calls = uint64((len(in.Data) + world.AllreduceChunk() - 1) / world.AllreduceChunk())
		}
	}
	for _, o := range []horovod.AllreduceOptions{{Op: horovod.Sum}, {Op: horovod.Sum, Output: make([]byte, len(in.Data))}} {
		before, sharedBefore := world.AllreduceCalls(), world.SharedAllreduces()
		got, err := hvd.Allreduce("large", in, o)
		if err != nil {
			t.Fatal(err)
		}
		if n, s := world.AllreduceCalls()-before, world.SharedAllreduces()-sharedBefore; n != calls || s != shared {
			t.Errorf("output given %v: %d MPI_Allreduce calls and %d over shared memory for %d bytes, want %d and %d", o.Output != nil, n, s, len(in.Data), calls, shared)
		}
		if !bytes.Equal(got.Data, raw[largeKey]) {
			t.Errorf("output given %v: horovod's allreduce and one MPI_Allreduce differ", o.Output != nil)
		}
	}
}

func TestJoin(t *testing.T) {
	lastRank := hvd.Size() - 1
	if hvd.Rank() == lastRank && hvd.Size() > 1 {
		// Out of data first: take part in the others' allreduce with zeros.
		if _, err := hvd.Join(); err != nil {
			t.Fatal(err)
		}
		return
	}
	s := float64(hvd.Size())
	got, err := hvd.Allreduce("join/sum", tensor(backend.Float32, []int{1}, []float64{float64(hvd.Rank() + 1)}), horovod.AllreduceOptions{Op: horovod.Sum})
	if err != nil {
		t.Fatal(err)
	}
	want := s * (s + 1) / 2
	if hvd.Size() > 1 {
		want -= s // the joined rank contributed zero instead of size
	}
	expectValues(t, "join/sum", got, backend.Float32, []int{1}, []float64{want})
	last, err := hvd.Join()
	if err != nil {
		t.Fatal(err)
	}
	if hvd.Size() == 1 && last != 0 {
		t.Errorf("last joined rank %d", last)
	}
}

// Empty tensors are legal everywhere, alone and among others in a fusion batch.
func TestEmptyTensors(t *testing.T) {
	empty := tensor(backend.Float32, []int{0, 3}, nil)
	got, err := hvd.Allreduce("empty/allreduce", empty, horovod.AllreduceOptions{})
	if err != nil || len(got.Data) != 0 || !equalInts(got.Shape, []int{0, 3}) {
		t.Fatalf("allreduce of an empty tensor: %v %v", got, err)
	}
	outs, err := hvd.GroupedAllreduce([]horovod.NamedTensor{
		{Name: "empty/a", Tensor: empty},
		{Name: "empty/b", Tensor: tensor(backend.Float32, []int{2}, []float64{1, 2})},
	}, horovod.AllreduceOptions{Op: horovod.Sum})
	if err != nil {
		t.Fatal(err)
	}
	s := float64(hvd.Size())
	expectValues(t, "empty/b", outs[1], backend.Float32, []int{2}, []float64{s, 2 * s})
	rows := hvd.Rank() % 2 // some ranks gather nothing
	in := make([]float64, rows*3)
	gathered, err := hvd.Allgather("empty/gather", tensor(backend.Int32, []int{rows, 3}, in))
	if err != nil {
		t.Fatal(err)
	}
	if want := hvd.Size() / 2; gathered.Shape[0] != want {
		t.Errorf("gathered %v rows, want %d", gathered.Shape, want)
	}
	if _, err := hvd.Broadcast("empty/bcast", empty, 0); err != nil {
		t.Fatal(err)
	}
}

// Blocking allreduces made in step by every rank complete, most of them, in the negotiation round
// their caller runs, with no hand-over to the background loop (the fast path of a training loop;
// LoopStats counts it). Half is far below what a quiet machine shows and leaves room for the
// rounds a late rank's timer starts.
func TestBlockingCallsRunTheirOwnRound(t *testing.T) {
	const calls = 300
	if err := hvd.Barrier(); err != nil {
		t.Fatal(err)
	}
	before := hvd.LoopStats()
	out := make([]byte, 4*1024)
	x := horovod.Tensor{DType: backend.Float32, Shape: []int{1024}, Data: encode(backend.Float32, make([]float64, 1024))}
	for i := range calls {
		binary.LittleEndian.PutUint32(x.Data, math.Float32bits(float32(i+hvd.Rank())))
		got, err := hvd.Allreduce("in-step", x, horovod.AllreduceOptions{Op: horovod.Sum, Output: out})
		if err != nil {
			t.Fatal(err)
		}
		n := hvd.Size()
		if v, want := decode(got)[0], float64(n*i+n*(n-1)/2); v != want {
			t.Fatalf("call %d: got %v, want %v", i, v, want)
		}
	}
	after := hvd.LoopStats()
	ran, handed := after.CallerRounds-before.CallerRounds, after.HandOvers-before.HandOvers
	t.Logf("rank %d: %d of %d blocking allreduces ran their own round, %d handed over", hvd.Rank(), ran, calls, handed)
	if hvd.Size() > 1 && ran < calls/2 {
		t.Errorf("rank %d: %d of %d blocking allreduces in step ran their own round (%d handed over): want at least half", hvd.Rank(), ran, calls, handed)
	}
}

// A released result's memory is the next result of its size on the real backend, holding that
// call's values: Allreduce, Allgather and Broadcast, with the rows of each rank apart.
func TestReleasedResultsAreReused(t *testing.T) {
	// Released memory left unused is dropped over two garbage collections (as documented):
	// collections between the calls, which the package's other tests' garbage can bring on,
	// would make a new buffer right. Without them the released one must come back (2 runs in
	// 100 got a new allgather buffer with the collector on).
	defer debug.SetGCPercent(debug.SetGCPercent(-1))
	const n = 1 << 16
	size, rank := hvd.Size(), hvd.Rank()
	calls := []struct {
		what string
		call func(x horovod.Tensor) (horovod.Tensor, error)
		want func(step int) []float64
	}{
		{"allreduce", func(x horovod.Tensor) (horovod.Tensor, error) {
			return hvd.Allreduce("release/allreduce", x, horovod.AllreduceOptions{Op: horovod.Sum})
		}, func(step int) []float64 {
			w := make([]float64, n)
			for i := range w {
				w[i] = float64(size*(step+i%100) + size*(size-1)/2)
			}
			return w
		}},
		{"allgather", func(x horovod.Tensor) (horovod.Tensor, error) { return hvd.Allgather("release/allgather", x) },
			func(step int) []float64 {
				w := make([]float64, 0, size*n)
				for r := range size {
					for i := range n {
						w = append(w, float64(step+i%100+r))
					}
				}
				return w
			}},
		{"broadcast", func(x horovod.Tensor) (horovod.Tensor, error) { return hvd.Broadcast("release/broadcast", x, size-1) },
			func(step int) []float64 {
				w := make([]float64, n)
				for i := range w {
					w[i] = float64(step + i%100 + size - 1)
				}
				return w
			}},
	}
	for _, c := range calls {
		var first horovod.Tensor
		for step := range 3 {
			mine := make([]float64, n)
			for i := range mine {
				mine[i] = float64(step + i%100 + rank)
			}
			got, err := c.call(tensor(backend.Float32, []int{n}, mine))
			if err != nil {
				t.Fatalf("%s step %d: %v", c.what, step, err)
			}
			want := c.want(step)
			expectValues(t, fmt.Sprintf("%s step %d", c.what, step), got, backend.Float32, []int{len(want)}, want)
			if step == 0 {
				first = got
			} else if &got.Data[0] != &first.Data[0] {
				t.Errorf("%s step %d: a new buffer, not the one released", c.what, step)
			}
			if err := hvd.Release(got); err != nil {
				t.Fatalf("%s step %d: %v", c.what, step, err)
			}
		}
	}
}

// patterned is n bytes that differ by rank and by position (a hash of both, so that no
// part of a shared-memory copy's double buffer can stand in for another).
func patterned(rank, n int) []byte {
	b := make([]byte, n)
	for i := 0; i+4 <= n; i += 4 {
		binary.LittleEndian.PutUint32(b[i:], uint32(i/4)*2654435761^uint32(rank+1)*40503)
	}
	return b
}

// TestLargeBroadcastAndAllgatherTakeSharedMemory: horovod's broadcast (alone and as
// BroadcastVariables) and allgather of tensors past the MPI backend's shared-memory thresholds
// give root's bytes, and every rank's in rank order, and the backend counts them as gone over
// shared memory where the whole job is on one machine (broadcasts from
// mpi.SharedBroadcastMinBytes, at 2 ranks SharedBroadcastMinBytes2; allgathers from
// SharedAllgatherMinBytes, at 2 ranks SharedAllgatherMinBytes2), through MPI elsewhere.
func TestLargeBroadcastAndAllgatherTakeSharedMemory(t *testing.T) {
	if world == nil {
		t.Skip("the MPI backend's counters need mpirun")
	}
	oneMachine := len(ranksPerHost(hosts)) == 1 && hvd.Size() > 1
	n, gathered := mpi.SharedBroadcastMinBytes, mpi.SharedAllgatherMinBytes
	if hvd.Size() == 2 {
		n, gathered = mpi.SharedBroadcastMinBytes2, mpi.SharedAllgatherMinBytes2
	}
	root := hvd.Size() - 1
	want := patterned(root, n)
	expectShared := func(what string, before, after uint64) {
		t.Helper()
		if shared := after - before; (shared == 1) != oneMachine || shared > 1 {
			t.Errorf("%s: %d over shared memory, want it there: %v", what, shared, oneMachine)
		}
	}

	before := world.SharedBroadcasts()
	got, err := hvd.Broadcast("large/broadcast", horovod.Tensor{DType: backend.Int32, Shape: []int{n / 4}, Data: patterned(hvd.Rank(), n)}, root)
	if err != nil {
		t.Fatal(err)
	}
	expectShared("Broadcast", before, world.SharedBroadcasts())
	if !bytes.Equal(got.Data, want) {
		t.Errorf("Broadcast: rank %d's result is not root %d's tensor", hvd.Rank(), root)
	}

	// A variable as long again as the threshold, and a short one fused with it.
	vars := []horovod.NamedTensor{
		{Name: "large/var", Tensor: horovod.Tensor{DType: backend.Int32, Shape: []int{n / 4}, Data: patterned(hvd.Rank(), n)}},
		{Name: "large/small", Tensor: horovod.Tensor{DType: backend.Int32, Shape: []int{16}, Data: patterned(hvd.Rank()+7, 64)}},
	}
	before = world.SharedBroadcasts()
	if err := hvd.BroadcastVariables(vars, root); err != nil {
		t.Fatal(err)
	}
	expectShared("BroadcastVariables", before, world.SharedBroadcasts())
	if !bytes.Equal(vars[0].Tensor.Data, want) || !bytes.Equal(vars[1].Tensor.Data, patterned(root+7, 64)) {
		t.Errorf("BroadcastVariables: rank %d's variables are not root %d's", hvd.Rank(), root)
	}

	// Rows of 1 KiB, rank r sending r+1 rows more than a share of the threshold.
	const row = 1024
	rows := func(r int) int { return gathered/row/hvd.Size() + r + 1 }
	var all []byte
	for r := range hvd.Size() {
		all = append(all, patterned(r, rows(r)*row)...)
	}
	mine := horovod.Tensor{DType: backend.Uint8, Shape: []int{rows(hvd.Rank()), row}, Data: patterned(hvd.Rank(), rows(hvd.Rank())*row)}
	before = world.SharedAllgathers()
	out, err := hvd.AllgatherInto("large/allgather", mine, make([]byte, len(all)))
	if err != nil {
		t.Fatal(err)
	}
	expectShared("AllgatherInto", before, world.SharedAllgathers())
	if !bytes.Equal(out.Data, all) {
		t.Errorf("AllgatherInto: rank %d's result is not every rank's rows in rank order", hvd.Rank())
	}
}

// BroadcastObject and AllgatherObject carry gob-encoded values between processes: the last
// rank's state to every rank, and every rank's, in rank order.
func TestObjects(t *testing.T) {
	type state struct {
		Rank  int
		Names []string
	}
	stateOf := func(r int) state { return state{Rank: r, Names: strings.Split(strings.Repeat("x,", r+1), ",")} }
	root := hvd.Size() - 1
	got, err := horovod.BroadcastObject(hvd, "objects/state", stateOf(hvd.Rank()), root)
	if err != nil {
		t.Fatal(err)
	}
	if want := stateOf(root); !reflect.DeepEqual(got, want) {
		t.Errorf("broadcast: %+v, want %+v", got, want)
	}
	all, err := horovod.AllgatherObject(hvd, "objects/states", stateOf(hvd.Rank()))
	if err != nil {
		t.Fatal(err)
	}
	for r := range hvd.Size() {
		if r >= len(all) || !reflect.DeepEqual(all[r], stateOf(r)) {
			t.Fatalf("allgather: %+v, want rank %d's %+v at %d", all, r, stateOf(r), r)
		}
	}
}
