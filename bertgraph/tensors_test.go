package bertgraph

import (
	"fmt"
	"slices"
	"strings"
	"testing"
	"unsafe"

	"github.com/gorovod/gorovod/tf"
)

// TestFlatTensorsOver: a FlatTensors over a caller's buffer is that buffer (no copy, values
// kept), cut into the same views as NewFlatTensors', which TrainStep and Apply accept; a buffer
// of the wrong length is refused with both lengths named.
func TestFlatTensorsOver(t *testing.T) {
	vars := []VariableSpec{
		{Name: "bert/embeddings/word_embeddings", Shape: []int64{5, 3}},
		{Name: "output_bias", Shape: []int64{2}},
		{Name: "scalar", Shape: []int64{}},
		{Name: "bert/pooler/dense/kernel", Shape: []int64{3, 3}},
	}
	m := &Model{contract: &Contract{Variables: vars}}
	const total = 15 + 2 + 1 + 9
	data := make([]float32, total)
	for i := range data {
		data[i] = float32(i)
	}
	f, err := m.FlatTensorsOver(data)
	if err != nil {
		t.Fatal(err)
	}
	if unsafe.SliceData(f.Data) != unsafe.SliceData(data) || len(f.Data) != total {
		t.Fatal("Data is not the buffer given")
	}
	if err := f.check(vars); err != nil {
		t.Fatal(err)
	}
	fresh := m.NewFlatTensors()
	if len(fresh.Data) != total || len(fresh.Parts) != len(vars) {
		t.Fatalf("NewFlatTensors: %d values in %d parts, want %d in %d", len(fresh.Data), len(fresh.Parts), total, len(vars))
	}
	off := 0
	for i, part := range f.Parts {
		n := vars[i].NumElements()
		// The capacity runs to the end of the buffer: horovod fuses views whose capacity spans
		// their neighbours in place (see FlatTensors).
		if len(part) != n || cap(part) != total-off || len(fresh.Parts[i]) != n || cap(fresh.Parts[i]) != total-off {
			t.Fatalf("part %d: len %d cap %d (NewFlatTensors: len %d cap %d), want len %d cap %d",
				i, len(part), cap(part), len(fresh.Parts[i]), cap(fresh.Parts[i]), n, total-off)
		}
		if &part[0] != &data[off] || part[0] != float32(off) {
			t.Fatalf("part %d (%s) does not start at value %d of the buffer (holds %v)", i, vars[i].Name, off, part[0])
		}
		if &fresh.Parts[i][0] != &fresh.Data[off] {
			t.Fatalf("NewFlatTensors part %d does not start at value %d", i, off)
		}
		off += n
	}
	f.Parts[3][8] = -1
	if data[total-1] != -1 {
		t.Fatal("a write to the last part does not reach the buffer")
	}
	for _, n := range []int{total - 1, total + 1, 0} {
		_, err := m.FlatTensorsOver(make([]float32, n))
		want := []string{fmt.Sprintf("buffer of %d float32 values", n), "4 variables, which have 27 (108 bytes)"}
		if err == nil || !strings.Contains(err.Error(), want[0]) || !strings.Contains(err.Error(), want[1]) {
			t.Errorf("FlatTensorsOver of %d values: %v, want an error naming %q", n, err, want)
		}
	}
}

// copyOut refuses a tensor whose size is not its destination's before writing anything: a view's
// capacity reaches into the next variable's values, which a longer tensor would overwrite.
func TestCopyOutChecksTheCountBeforeWriting(t *testing.T) {
	data := []float32{1, 2, 3, 4, 5}
	f := flatTensorsOver([]VariableSpec{{Name: "a", Shape: []int64{2}}, {Name: "b", Shape: []int64{3}}}, data)
	for _, values := range [][]float32{{9, 9, 9}, {9}} {
		long, err := tf.NewTensor(values, int64(len(values)))
		if err != nil {
			t.Fatal(err)
		}
		err = copyOut(long, f.Parts[0])
		long.Close()
		if err == nil || !strings.Contains(err.Error(), fmt.Sprintf("%d elements, want 2", len(values))) {
			t.Errorf("%d values into 2: %v, want an error naming both counts", len(values), err)
		}
		if !slices.Equal(data, []float32{1, 2, 3, 4, 5}) {
			t.Fatalf("a refused copy wrote into the buffer: %v", data)
		}
	}
	fits, err := tf.NewTensor([]float32{7, 8}, 2)
	if err != nil {
		t.Fatal(err)
	}
	defer fits.Close()
	if err := copyOut(fits, f.Parts[0]); err != nil || !slices.Equal(data, []float32{7, 8, 3, 4, 5}) {
		t.Errorf("copy of 2 values: %v, buffer %v", err, data)
	}
}
