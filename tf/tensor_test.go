package tf

import (
	"math"
	"slices"
	"strings"
	"testing"

	"github.com/x448/float16"
)

func roundTrip[T Scalar](t *testing.T, want DataType, values []T, shape ...int64) {
	t.Helper()
	tensor, err := NewTensor(values, shape...)
	if err != nil {
		t.Fatal(err)
	}
	defer tensor.Close()
	if tensor.DataType() != want || !slices.Equal(tensor.Shape(), shape) && len(shape) > 0 {
		t.Errorf("%T: %s, want %s%v", values, tensor, want, shape)
	}
	got, err := Values[T](tensor, nil)
	if err != nil || !slices.Equal(got, values) {
		t.Errorf("%T: read back %v (%v), want %v", values, got, err, values)
	}
}

func TestTensorRoundTrip(t *testing.T) {
	roundTrip(t, Float, []float32{1.5, -0, float32(math.Inf(1)), math.MaxFloat32, math.SmallestNonzeroFloat32, 7, 8}, 7)
	roundTrip(t, Double, []float64{math.Pi, -1e300, 5e-324, 0}, 2, 2)
	roundTrip(t, Int32, []int32{math.MinInt32, -1, 0, math.MaxInt32, 5, 6}, 3, 1, 2)
	roundTrip(t, Int64, []int64{math.MinInt64, math.MaxInt64}, 2)
	roundTrip(t, Bool, []bool{true, false, false, true}, 4)
	roundTrip(t, Uint8, []uint8{0, 255, 17}, 3)
	roundTrip(t, Int64, []int64{42})       // scalar
	roundTrip(t, Float, []float32{}, 0, 3) // empty
	roundTrip(t, Int32, []int32{}, 3, 0, 2)
}

func TestScalarAndEmptyShapes(t *testing.T) {
	s, _ := NewTensor([]float64{2.5})
	defer s.Close()
	if len(s.Shape()) != 0 || s.NumElements() != 1 || s.String() != "Tensor(float64[])" {
		t.Errorf("scalar: %s shape %v", s, s.Shape())
	}
	e, _ := NewStringTensor(nil, 0)
	defer e.Close()
	if v, err := e.Strings(); err != nil || len(v) != 0 {
		t.Errorf("empty strings: %v %v", v, err)
	}
}

func TestFloat16Bits(t *testing.T) {
	values := []float32{0.5, -1.25, 65504, 0.0001, float32(math.Inf(-1))}
	bits := make([]uint16, len(values))
	for i, v := range values {
		bits[i] = float16.Fromfloat32(v).Bits()
	}
	tensor, err := NewFloat16Tensor(bits, 5)
	if err != nil {
		t.Fatal(err)
	}
	defer tensor.Close()
	if tensor.DataType() != Half {
		t.Fatalf("dtype %s", tensor.DataType())
	}
	buf := make([]uint16, 0, 8)
	got, err := tensor.Float16Bits(buf)
	if err != nil || !slices.Equal(got, bits) || &got[0] != &buf[:1][0] {
		t.Errorf("read back %v (%v), want %v in the given buffer", got, err, bits)
	}
	if _, err := tensor.Float32s(); err == nil || !strings.Contains(err.Error(), "float16[5], read as float32") {
		t.Errorf("float16 read as float32: %v", err)
	}
}

func TestStrings(t *testing.T) {
	values := []string{"", "short", strings.Repeat("long ", 20), "nul\x00and\xffbytes", "日本語"}
	tensor, err := NewStringTensor(values, 5, 1)
	if err != nil {
		t.Fatal(err)
	}
	defer tensor.Close()
	got, err := tensor.Strings()
	if err != nil || !slices.Equal(got, values) {
		t.Errorf("read back %q (%v), want %q", got, err, values)
	}
	if _, err := tensor.Int32s(); err == nil {
		t.Error("a string tensor read as int32")
	}
}

func TestNewTensorShapeErrors(t *testing.T) {
	for _, tc := range []struct {
		shape []int64
		want  string
	}{
		{[]int64{2, 2}, "shape [2 2] holds 4 values, got 3"},
		{nil, "shape [] holds 1 values, got 3"},
		{[]int64{-1, 3}, "negative dimension"},
		// Products that wrap around to 0 or to 3 would pass a plain product check, and
		// TensorFlow would abort the process on them.
		{[]int64{1 << 62, 4, 0}, "more than 2305843009213693951 elements of 4 bytes"},
		{[]int64{1 << 32, 1 << 32}, "more than"},
		{[]int64{1 << 32, 1 << 32, 1 << 32, 1 << 32, 3}, "more than"},
		{[]int64{math.MaxInt64, math.MaxInt64}, "more than"},
		{[]int64{1 << 61, 0}, "more than"}, // 2^61 int32 elements are 2^63 bytes
		{make([]int64, maxRank+1), "255 dimensions, TensorFlow allows 254"},
	} {
		if _, err := NewTensor([]int32{1, 2, 3}, tc.shape...); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("shape %v: %v, want %q", tc.shape, err, tc.want)
		}
	}
	if _, err := NewStringTensor([]string{"a"}, 2); err == nil {
		t.Error("a string tensor with too few values")
	}
	if _, err := NewStringTensor(nil, 1<<62, 1<<2); err == nil || !strings.Contains(err.Error(), "more than") {
		t.Errorf("a string tensor of 2^64 elements: %v", err)
	}
	if _, err := NewTensor([]float32{}, 1<<62, 4); err == nil || !strings.Contains(err.Error(), "more than") {
		t.Errorf("a float32 tensor of 2^64 elements: %v", err)
	}
	if _, err := NewFloat16Tensor(nil, 1<<32, 1<<32); err == nil || !strings.Contains(err.Error(), "more than") {
		t.Errorf("a float16 tensor of 2^64 elements: %v", err)
	}
	// The largest shapes that fit are accepted as far as the shape goes.
	ones := make([]int64, maxRank)
	for i := range ones {
		ones[i] = 1
	}
	x, err := NewTensor([]int32{7}, ones...)
	if err != nil || len(x.Shape()) != maxRank {
		t.Errorf("a shape of %d ones: %v", maxRank, err)
	}
	x.Close()
}

func TestValuesReusesBuffer(t *testing.T) {
	tensor, _ := NewTensor([]int32{1, 2, 3}, 3)
	defer tensor.Close()
	buf := make([]int32, 1, 10)
	got, err := Values(tensor, buf)
	if err != nil || &got[0] != &buf[0] || !slices.Equal(got, []int32{1, 2, 3}) {
		t.Errorf("Values into a large enough buffer: %v %v, same storage %v", got, err, &got[0] == &buf[0])
	}
	// A buffer of exactly the tensor's size is reused too: bertgraph reads each variable into
	// its part of one flat buffer, and the last part has no capacity to spare.
	exact := make([]int32, 3)
	if got, _ = Values(tensor, exact[:0]); &got[0] != &exact[0] || !slices.Equal(exact, []int32{1, 2, 3}) {
		t.Errorf("Values into a buffer of exactly its size: %v, same storage %v", exact, &got[0] == &exact[0])
	}
	small := make([]int32, 0, 2)
	got, _ = Values(tensor, small)
	if !slices.Equal(got, []int32{1, 2, 3}) {
		t.Errorf("Values into a small buffer: %v", got)
	}
}

func TestClosedTensor(t *testing.T) {
	tensor, _ := NewTensor([]float32{1})
	tensor.Close()
	tensor.Close()
	if _, err := tensor.Float32s(); err == nil || !strings.Contains(err.Error(), "closed") {
		t.Errorf("read of a closed tensor: %v", err)
	}
	if tensor.String() != "Tensor(closed)" {
		t.Errorf("String() = %q", tensor.String())
	}
}

// TestOverwrite refills a feed in place while no one shares it, and moves it to a new buffer
// when an output of a Run (an Identity of the feed) still aliases it, leaving that output intact.
func TestOverwrite(t *testing.T) {
	s, in, out := identitySession(t, Float, []int64{3})
	x, _ := NewTensor([]float32{1, 2, 3}, 3)
	defer x.Close()
	if x.shared() {
		t.Fatal("a fresh tensor is shared")
	}
	before := x.c
	if err := Overwrite(x, []float32{4, 5, 6}); err != nil || x.c != before {
		t.Fatalf("in-place overwrite: %v, same tensor %v", err, x.c == before)
	}
	outs, err := s.Run(map[Output]*Tensor{in: x}, []Output{out}, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer outs[0].Close()
	if !x.shared() {
		t.Skip("TensorFlow copied the feed instead of aliasing it; the shared path is not exercised")
	}
	if err := Overwrite(x, []float32{7, 8, 9}); err != nil {
		t.Fatal(err)
	}
	if v, _ := outs[0].Float32s(); !slices.Equal(v, []float32{4, 5, 6}) {
		t.Errorf("the output aliasing the feed changed to %v", v)
	}
	if v, _ := x.Float32s(); !slices.Equal(v, []float32{7, 8, 9}) {
		t.Errorf("the feed reads %v", v)
	}
	if err := Overwrite(x, []float32{1}); err == nil {
		t.Error("overwrite with the wrong count")
	}
	if err := Overwrite(x, []int32{1, 2, 3}); err == nil {
		t.Error("overwrite with the wrong type")
	}
}
