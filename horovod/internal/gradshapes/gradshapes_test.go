package gradshapes

import "testing"

// The counts are all-MiniLM-L6-v2's published parameter count (22,713,216 in the encoder and
// pooler) plus a 384x2 classifier and its bias.
func TestMiniLMSize(t *testing.T) {
	shapes := MiniLM()
	n := 0
	for _, s := range shapes {
		e := 1
		for _, d := range s {
			e *= d
		}
		n += e
	}
	if len(shapes) != 105 || n != 22_713_986 {
		t.Errorf("MiniLM: %d tensors of %d float32 in all, want 105 of 22,713,986", len(shapes), n)
	}
}
