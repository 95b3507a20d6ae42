package horovod

import (
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"
	"unsafe"
)

// Allreduce into the caller's Output: a buffer reused from call to call, and the tensor itself
// (in place), with the scalings that run as passes of their own.
func TestAllreduceIntoOutput(t *testing.T) {
	hs, _ := job(t, 3)
	onEveryRank(t, hs, func(h *Horovod) error {
		r := float32(h.Rank())
		out := make([]byte, 4*4)
		for step, c := range []struct {
			o    AllreduceOptions
			want []float32
		}{
			{AllreduceOptions{Op: Sum}, []float32{3, -3, 6, 30}},
			{AllreduceOptions{}, []float32{1, -1, 2, 10}},
			{AllreduceOptions{Op: Sum, Prescale: 0.5, Postscale: 4}, []float32{6, -6, 12, 60}},
		} {
			x := mustTensor(t, []int{2, 2}, []float32{r, -r, 2 * r, 10})
			for _, inPlace := range []bool{false, true} {
				o := c.o
				o.Output = out
				if inPlace {
					o.Output = x.Data
				}
				got, err := h.Allreduce(fmt.Sprintf("x%d", step), x, o)
				if err != nil {
					return err
				}
				if unsafe.SliceData(got.Data) != unsafe.SliceData(o.Output) {
					return fmt.Errorf("%+v: the result is not in Output", c.o)
				}
				if v := mustValues[float32](got); !slices.Equal(v, c.want) {
					return fmt.Errorf("%+v in place %v: got %v, want %v", c.o, inPlace, v, c.want)
				}
			}
		}
		return nil
	})
}

// Without Output every result is a buffer of its own: a later allreduce of the same name and
// size must not write into a result the caller still holds, nor into the input.
func TestAllreduceResultsNeverAlias(t *testing.T) {
	hs, _ := job(t, 2)
	onEveryRank(t, hs, func(h *Horovod) error {
		var held []Tensor
		for i := range 4 {
			x := mustTensor(t, []int{3}, []float32{float32(i), 1, 2})
			got, err := h.Allreduce("x", x, AllreduceOptions{Op: Sum})
			if err != nil {
				return err
			}
			if unsafe.SliceData(got.Data) == unsafe.SliceData(x.Data) {
				return errors.New("the result is the input")
			}
			held = append(held, got)
		}
		for i, r := range held {
			if v, want := mustValues[float32](r), []float32{float32(2 * i), 2, 4}; !slices.Equal(v, want) {
				return fmt.Errorf("result %d changed to %v after later calls, want %v", i, v, want)
			}
		}
		return nil
	})
}

func TestAllreduceOutputMisuse(t *testing.T) {
	hs, _ := job(t, 1)
	h := hs[0]
	x := mustTensor(t, []int{4}, []float32{1, 2, 3, 4})
	for _, c := range []struct {
		out  []byte
		want string
	}{
		{make([]byte, 12), "Output holds 12 bytes for a tensor of 16"},
		{x.Data[4:], "Output holds 12 bytes"},
		{slices.Concat(x.Data, x.Data)[4:20], ""}, // apart from x: fine
	} {
		_, err := h.Allreduce("x", x, AllreduceOptions{Output: c.out})
		if c.want == "" {
			if err != nil {
				t.Errorf("Output apart from the tensor: %v", err)
			}
		} else if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("Output of %d bytes: err = %v, want %q", len(c.out), err, c.want)
		}
	}
	// Partly overlapping, same length: a view of a larger buffer shifted by one element.
	buf := make([]byte, 20)
	y := Tensor{DType: Float32, Shape: []int{4}, Data: buf[:16]}
	if _, err := h.Allreduce("y", y, AllreduceOptions{Output: buf[4:]}); err == nil || !strings.Contains(err.Error(), "partly overlaps") {
		t.Errorf("overlapping Output: err = %v", err)
	}
	_, err := h.GroupedAllreduce([]NamedTensor{{Name: "g", Tensor: x}}, AllreduceOptions{Output: make([]byte, 16)})
	if err == nil || !strings.Contains(err.Error(), "not a group's") {
		t.Errorf("grouped Output: err = %v", err)
	}
}

// The negotiation's shortcut for submissions that all match must leave every mismatch, a
// broadcast from a joined root and every allgather to the full check.
func TestAgreedAsIs(t *testing.T) {
	ref := &spec{name: "a", kind: kindAllreduce, dtype: Float32, shape: []int{2}, prescale: 1, postscale: 1}
	same := *ref
	other := *ref
	other.shape = []int{3}
	grouped := *ref
	grouped.group, grouped.groupSize = "group.1", 2
	bcast := &spec{name: "b", kind: kindBroadcast, dtype: Float32, shape: []int{2}, root: 1}
	gather := &spec{name: "c", kind: kindAllgather, dtype: Float32, shape: []int{2}}
	for _, c := range []struct {
		specs []*spec
		ref   *spec
		want  bool
	}{
		{[]*spec{ref, &same, nil}, ref, true},
		{[]*spec{ref, &other}, ref, false},
		{[]*spec{ref, &grouped}, ref, false},
		{[]*spec{bcast, bcast}, bcast, true},
		{[]*spec{bcast, nil}, bcast, false},
		{[]*spec{gather, gather}, gather, false},
	} {
		if got := agreedAsIs(c.specs, c.ref); got != c.want {
			t.Errorf("agreedAsIs(%v) = %v, want %v", c.specs, got, c.want)
		}
	}
}
