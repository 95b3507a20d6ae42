package tf

import (
	"runtime"
	"slices"
	"strings"
	"testing"
	"time"
	"unsafe"
)

// aligned returns n zeroed values starting at a TensorAlignment boundary, in an allocation with
// room to spare so that the test does not rely on how Go aligns large ones.
func aligned[T Scalar](n int) []T {
	var zero T
	buf := make([]T, n+TensorAlignment/int(unsafe.Sizeof(zero)))
	skip := 0
	for uintptr(unsafe.Pointer(&buf[skip]))%TensorAlignment != 0 {
		skip++
	}
	return buf[skip : skip+n : skip+n]
}

// waitViewsLive waits for the count of live views to reach want (cleanups of unreachable
// tensors run on their own goroutine after a collection) and reports whether it did.
func waitViewsLive(want int64) bool {
	for range 100 {
		if viewsLive.Load() == want {
			return true
		}
		runtime.GC()
		time.Sleep(5 * time.Millisecond)
	}
	return false
}

// A tensor over a slice reads the slice's memory itself: a write to the slice after the tensor
// was made is what the tensor holds and what a run is fed. An ordinary tensor, a copy, does not
// see it: the contrast shows the check can tell.
func TestTensorOverReadsTheSlice(t *testing.T) {
	base := viewsLive.Load()
	s, in, out := identitySession(t, Float, []int64{2, 2})
	values := aligned[float32](4)
	copy(values, []float32{1, 2, 3, 4})
	view, err := NewTensorOver(values, 2, 2)
	if err != nil {
		t.Fatal(err)
	}
	copied, _ := NewTensor(values, 2, 2)
	defer copied.Close()
	if got := viewsLive.Load() - base; got != 1 {
		t.Errorf("%d live views after one NewTensorOver", got)
	}
	values[0], values[3] = -1, 40
	if v, _ := view.Float32s(); !slices.Equal(v, []float32{-1, 2, 3, 40}) {
		t.Errorf("the view reads %v, want the slice's values as written after it was made", v)
	}
	if v, _ := copied.Float32s(); !slices.Equal(v, []float32{1, 2, 3, 4}) {
		t.Errorf("the copy reads %v", v)
	}
	outs, err := s.Run(map[Output]*Tensor{in: view}, []Output{out}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if v, _ := outs[0].Float32s(); !slices.Equal(v, []float32{-1, 2, 3, 40}) {
		t.Errorf("a run fed the view returned %v", v)
	}
	if !slices.Equal(values, []float32{-1, 2, 3, 40}) {
		t.Errorf("the run changed the slice to %v", values)
	}
	outs[0].Close()
	view.Close()
	if got := viewsLive.Load() - base; got != 0 {
		t.Errorf("%d live views once the view and the run's output are closed", got)
	}
}

// An output that aliases the view (Identity forwards its input's buffer) keeps the memory: the
// view closed, the slice dropped and the heap collected, the output still reads the values, and
// the memory is released only when the output is closed too.
func TestTensorOverOutlivedByAnAliasingOutput(t *testing.T) {
	base := viewsLive.Load()
	s, in, out := identitySession(t, Float, []int64{-1})
	const n = 1 << 16
	values := aligned[float32](n)
	for i := range values {
		values[i] = float32(i)
	}
	view, err := NewTensorOver(values, n)
	if err != nil {
		t.Fatal(err)
	}
	outs, err := s.Run(map[Output]*Tensor{in: view}, []Output{out}, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer outs[0].Close()
	view.Close()
	values = nil // the point: nothing in Go refers to the memory now
	runtime.GC()
	runtime.GC()
	garbage := make([][]float32, 16) // allocations that would reuse the memory were it freed
	for i := range garbage {
		garbage[i] = make([]float32, n)
		for j := range garbage[i] {
			garbage[i][j] = -1
		}
	}
	runtime.KeepAlive(garbage)
	if viewsLive.Load()-base != 1 {
		t.Skip("TensorFlow copied the fed tensor instead of forwarding it to Identity's output; the aliasing path is not exercised")
	}
	got, _ := outs[0].Float32s()
	for i, v := range got {
		if v != float32(i) {
			t.Fatalf("output[%d] = %v once the view was closed and the slice collected, want %d", i, v, i)
		}
	}
	outs[0].Close()
	if got := viewsLive.Load() - base; got != 0 {
		t.Errorf("%d live views once the aliasing output is closed", got)
	}
}

// Many views over one allocation (a flat gradient buffer's parts): each pins it, and closing
// some leaves the others reading it.
func TestTensorOverPartsOfOneAllocation(t *testing.T) {
	base := viewsLive.Load()
	flat := aligned[float32](64)
	for i := range flat {
		flat[i] = float32(i)
	}
	var views []*Tensor
	for off := 0; off < len(flat); off += 16 {
		v, err := NewTensorOver(flat[off:off+16], 4, 4)
		if err != nil {
			t.Fatal(err)
		}
		views = append(views, v)
	}
	views[0].Close()
	views[2].Close()
	runtime.GC()
	for _, i := range []int{1, 3} {
		got, _ := views[i].Float32s()
		if !slices.Equal(got, flat[16*i:16*(i+1)]) {
			t.Errorf("view %d reads %v", i, got)
		}
	}
	views[1].Close()
	views[3] = nil // left to the cleanup
	if !waitViewsLive(base) {
		t.Errorf("%d live views left after Close and a collection of the unclosed one", viewsLive.Load()-base)
	}
}

func TestTensorOverRefusesWhatItCannotWrap(t *testing.T) {
	flat := aligned[float32](32)
	if _, err := NewTensorOver(flat[1:17], 16); err == nil || !strings.Contains(err.Error(), "64-byte aligned") {
		t.Errorf("misaligned memory: %v, want an error naming the alignment", err)
	}
	if _, err := NewTensorOver(flat[:16], 3, 4); err == nil {
		t.Error("16 values as a [3,4] tensor: no error")
	}
	empty, err := NewTensorOver([]float32{}, 0, 5)
	if err != nil {
		t.Fatal(err)
	}
	defer empty.Close()
	if empty.NumElements() != 0 || !slices.Equal(empty.Shape(), []int64{0, 5}) {
		t.Errorf("empty view: %s", empty)
	}
	ints := aligned[int64](8)
	view, err := NewTensorOver(ints, 2, 4)
	if err != nil {
		t.Fatal(err)
	}
	defer view.Close()
	ints[5] = -7
	if v, _ := view.Int64s(); v[5] != -7 || view.DataType() != Int64 {
		t.Errorf("int64 view: %s reads %v", view, v)
	}
}

// Overwrite on a view gives it a buffer of its own (TensorFlow never reports memory it does not
// own as unshared), leaving the slice as it was.
func TestOverwriteOfATensorOverCopies(t *testing.T) {
	base := viewsLive.Load()
	values := aligned[float32](3)
	copy(values, []float32{1, 2, 3})
	view, err := NewTensorOver(values, 3)
	if err != nil {
		t.Fatal(err)
	}
	defer view.Close()
	if err := Overwrite(view, []float32{7, 8, 9}); err != nil {
		t.Fatal(err)
	}
	if v, _ := view.Float32s(); !slices.Equal(v, []float32{7, 8, 9}) || !slices.Equal(values, []float32{1, 2, 3}) {
		t.Errorf("after Overwrite the tensor reads %v and the slice %v", v, values)
	}
	if got := viewsLive.Load() - base; got != 0 {
		t.Errorf("%d live views once the tensor has a buffer of its own", got)
	}
}
