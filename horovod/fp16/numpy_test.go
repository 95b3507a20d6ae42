package fp16

import (
	"bytes"
	"encoding/binary"
	"math"
	"math/rand/v2"
	"os/exec"
	"testing"

	"github.com/gorovod/gorovod/tf/testenv"
)

// numpy converts through the project virtualenv's numpy (make setup creates it): a second,
// independent reference beside github.com/x448/float16.
func numpy(t *testing.T, script string, in []byte) []byte {
	t.Helper()
	cmd := exec.Command(testenv.VenvPython.Require(t), "-c", "import sys, numpy as np\n"+script)
	cmd.Stdin = bytes.NewReader(in)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("numpy: %v\n%s", err, stderr.String())
	}
	return out
}

func TestMatchesNumpy(t *testing.T) {
	paths(t, func(t *testing.T) {
		r := rand.New(rand.NewPCG(11, 12))
		in := append(edgeFloats(), make([]float32, 1<<18)...)
		for i := len(in) - 1<<18; i < len(in); i++ {
			in[i] = math.Float32frombits(r.Uint32())
		}
		raw := make([]byte, 4*len(in))
		for i, f := range in {
			binary.LittleEndian.PutUint32(raw[4*i:], math.Float32bits(f))
		}
		ref := numpy(t, "sys.stdout.buffer.write(np.frombuffer(sys.stdin.buffer.read(), '<f4').astype(np.float16).tobytes())", raw)
		got := make([]uint16, len(in))
		EncodeFloat32(got, in)
		for i, f := range in {
			want := binary.LittleEndian.Uint16(ref[2*i:])
			if isNaN32(f) {
				if got[i]&0x7c00 != 0x7c00 || got[i]&0x3ff == 0 || got[i]&0x8000 != want&0x8000 {
					t.Fatalf("NaN %#08x encoded to %#04x, numpy %#04x", math.Float32bits(f), got[i], want)
				}
				continue
			}
			if got[i] != want {
				t.Fatalf("%v (%#08x) encoded to %#04x, numpy says %#04x", f, math.Float32bits(f), got[i], want)
			}
		}

		ref = numpy(t, "sys.stdout.buffer.write(np.arange(65536, dtype='<u2').view(np.float16).astype('<f4').tobytes())", nil)
		all := make([]uint16, 1<<16)
		for i := range all {
			all[i] = uint16(i)
		}
		dec := make([]float32, len(all))
		DecodeFloat32(dec, all)
		for i, f := range dec {
			want := math.Float32frombits(binary.LittleEndian.Uint32(ref[4*i:]))
			if isNaN32(want) != isNaN32(f) || !isNaN32(f) && math.Float32bits(f) != math.Float32bits(want) {
				t.Fatalf("half %#04x decoded to %v, numpy says %v", i, f, want)
			}
		}
	})
}
