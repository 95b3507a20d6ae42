package conformance

import (
	"bytes"
	"encoding/binary"
	"math"
	"strconv"
	"strings"
	"testing"

	"github.com/gorovod/gorovod/horovod"
	"github.com/gorovod/gorovod/horovod/backend"
	"github.com/gorovod/gorovod/horovod/bf16"
	"github.com/gorovod/gorovod/horovod/fp16"
)

// encode writes vals as little-endian elements of dt (float16 through package fp16).
func encode(dt backend.DType, vals []float64) []byte {
	var b bytes.Buffer
	for _, v := range vals {
		switch dt {
		case backend.Uint8:
			b.WriteByte(uint8(v))
		case backend.Int8:
			b.WriteByte(byte(int8(v)))
		case backend.Int32:
			binary.Write(&b, binary.LittleEndian, int32(v))
		case backend.Int64:
			binary.Write(&b, binary.LittleEndian, int64(v))
		case backend.Float16:
			binary.Write(&b, binary.LittleEndian, fp16.FromFloat64(v))
		case backend.BFloat16:
			binary.Write(&b, binary.LittleEndian, bf16.FromFloat64(v))
		case backend.Float32:
			binary.Write(&b, binary.LittleEndian, float32(v))
		case backend.Float64:
			binary.Write(&b, binary.LittleEndian, v)
		}
	}
	return b.Bytes()
}

// decode reads the elements of a tensor as float64 (exact for every dtype and value used here).
func decode(t horovod.Tensor) []float64 {
	n := len(t.Data) / t.DType.Size()
	out := make([]float64, n)
	for i := range out {
		e := t.Data[i*t.DType.Size():]
		switch t.DType {
		case backend.Uint8:
			out[i] = float64(e[0])
		case backend.Int8:
			out[i] = float64(int8(e[0]))
		case backend.Int32:
			out[i] = float64(int32(binary.LittleEndian.Uint32(e)))
		case backend.Int64:
			out[i] = float64(int64(binary.LittleEndian.Uint64(e)))
		case backend.Float16:
			out[i] = fp16.ToFloat64(binary.LittleEndian.Uint16(e))
		case backend.BFloat16:
			out[i] = bf16.ToFloat64(binary.LittleEndian.Uint16(e))
		case backend.Float32:
			out[i] = float64(math.Float32frombits(binary.LittleEndian.Uint32(e)))
		case backend.Float64:
			out[i] = math.Float64frombits(binary.LittleEndian.Uint64(e))
		}
	}
	return out
}

func tensor(dt backend.DType, shape []int, vals []float64) horovod.Tensor {
	return horovod.Tensor{DType: dt, Shape: shape, Data: encode(dt, vals)}
}

func numElements(shape []int) int {
	n := 1
	for _, d := range shape {
		n *= d
	}
	return n
}

// expectValues fails t unless got has the wanted dtype, shape and values.
func expectValues(t *testing.T, what string, got horovod.Tensor, dt backend.DType, shape []int, want []float64) {
	t.Helper()
	if got.DType != dt || !equalInts(got.Shape, shape) {
		t.Errorf("%s: got %v%v, want %v%v", what, got.DType, got.Shape, dt, shape)
		return
	}
	vals := decode(got)
	for i := range want {
		if vals[i] != want[i] {
			t.Errorf("%s: element %d is %v, want %v", what, i, vals[i], want[i])
			return
		}
	}
}

func equalInts(a, b []int) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

// sameOnEveryRank gathers s from every rank and reports whether all ranks had the same string.
func sameOnEveryRank(t *testing.T, name, s string) bool {
	t.Helper()
	all, err := hvd.Allgather(name, horovod.Tensor{DType: backend.Uint8, Shape: []int{1, len(s)}, Data: []byte(s)})
	if err != nil {
		// Lengths differ across ranks: the trailing dimension disagrees.
		t.Errorf("gathering %q: %v", s, err)
		return false
	}
	for r := 0; r < hvd.Size(); r++ {
		if got := string(all.Data[r*len(s) : (r+1)*len(s)]); got != s {
			t.Errorf("rank %d has %q, rank %d has %q", r, got, hvd.Rank(), s)
			return false
		}
	}
	return true
}

// onRanks renders ranks as horovod's errors name them: "on rank 1", "on ranks 0,1".
func onRanks(ranks ...int) string {
	s := make([]string, len(ranks))
	for i, r := range ranks {
		s[i] = strconv.Itoa(r)
	}
	if len(ranks) == 1 {
		return "on rank " + s[0]
	}
	return "on ranks " + strings.Join(s, ",")
}

// allButLast is every rank but the last.
func allButLast() []int {
	ranks := make([]int, hvd.Size()-1)
	for r := range ranks {
		ranks[r] = r
	}
	return ranks
}
