package trainer

import (
	"strings"
	"testing"
)

// float32View takes aligned memory as it is and refuses what float32 values cannot lie in.
func TestFloat32View(t *testing.T) {
	mem := make([]byte, 17)
	v, err := float32View(mem[:16])
	if err != nil || len(v) != 4 {
		t.Fatalf("16 aligned bytes: %d values, %v", len(v), err)
	}
	v[3] = -2
	if mem[15] != 0xc0 { // -2 is 0xc0000000, little-endian on every platform Go and CUDA share
		t.Errorf("a write to the view does not reach the memory: % x", mem[12:16])
	}
	for _, b := range [][]byte{mem[1:5], mem[:6]} {
		if _, err := float32View(b); err == nil || !strings.Contains(err.Error(), "not an array of float32") {
			t.Errorf("%d bytes at offset %d: %v, want an error", len(b), cap(mem)-cap(b), err)
		}
	}
}
