package local

import (
	"bytes"
	"testing"

	"github.com/gorovod/gorovod/horovod/backend"
)

func TestReduceScatterAndAlltoallvCopy(t *testing.T) {
	var b Backend
	send := []byte{1, 2, 3, 4, 5, 6, 7, 8}
	recv := make([]byte, len(send))
	if err := b.ReduceScatter(send, recv, []int{8}, backend.Float32, backend.Max); err != nil || !bytes.Equal(recv, send) {
		t.Errorf("ReduceScatter: %v, recv %v", err, recv)
	}
	recv = make([]byte, len(send))
	if err := b.Alltoallv(send, []int{8}, recv, []int{8}); err != nil || !bytes.Equal(recv, send) {
		t.Errorf("Alltoallv: %v, recv %v", err, recv)
	}
	if err := b.ReduceScatter(nil, nil, []int{0}, backend.Float16, backend.Sum); err != nil {
		t.Errorf("empty ReduceScatter: %v", err)
	}
	if err := b.Alltoallv(nil, []int{0}, nil, []int{0}); err != nil {
		t.Errorf("empty Alltoallv: %v", err)
	}
}

func TestReduceScatterAndAlltoallvMisuse(t *testing.T) {
	var b Backend
	buf := make([]byte, 16)
	send, recv := buf[:8], buf[8:]
	for name, err := range map[string]error{
		"reduce-scatter, invalid dtype":      b.ReduceScatter(send, recv, []int{8}, backend.DType(0), backend.Sum),
		"reduce-scatter, invalid op":         b.ReduceScatter(send, recv, []int{8}, backend.Float32, backend.ReduceOp(0)),
		"reduce-scatter, two counts":         b.ReduceScatter(send, recv, []int{8, 0}, backend.Float32, backend.Sum),
		"reduce-scatter, part of an element": b.ReduceScatter(send[:6], recv[:6], []int{6}, backend.Float32, backend.Sum),
		"reduce-scatter, count off send":     b.ReduceScatter(send, recv, []int{4}, backend.Float32, backend.Sum),
		"reduce-scatter, recv too short":     b.ReduceScatter(send, recv[:4], []int{8}, backend.Float32, backend.Sum),
		"reduce-scatter, overlapping":        b.ReduceScatter(buf[:8], buf[4:12], []int{8}, backend.Float32, backend.Sum),
		"alltoallv, two send counts":         b.Alltoallv(send, []int{8, 0}, recv, []int{8}),
		"alltoallv, receive count off recv":  b.Alltoallv(send, []int{8}, recv, []int{4}),
		"alltoallv, recv too short":          b.Alltoallv(send, []int{8}, recv[:4], []int{4}),
		"alltoallv, the same buffer twice":   b.Alltoallv(send, []int{8}, send, []int{8}),
	} {
		if err == nil {
			t.Errorf("%s: no error", name)
		}
	}
}

func TestSplitIsTheOneRank(t *testing.T) {
	var b Backend
	if set, err := b.Split([]int{0}); err != nil || set != (Backend{}) {
		t.Errorf("Split([0]) = %v, %v", set, err)
	}
	for _, ranks := range [][]int{nil, {1}, {0, 1}} {
		if set, err := b.Split(ranks); err == nil {
			t.Errorf("Split(%v) = %v, want an error", ranks, set)
		}
	}
}
