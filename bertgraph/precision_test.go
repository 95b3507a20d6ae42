package bertgraph

import (
	"bytes"
	"encoding/json"
	"math"
	"math/rand/v2"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"testing"
)

func TestCPUBF16ReadsTheVendorAndFlagsLines(t *testing.T) {
	dir := t.TempDir()
	for _, tc := range []struct {
		name, cpuinfo string
		want          CPUBF16
		supported     bool
	}{
		{"EPYC with AVX2 only", "processor\t: 0\nvendor_id\t: AuthenticAMD\nflags\t\t: fpu avx2 f16c fma\n",
			CPUBF16{Vendor: "AuthenticAMD", Read: true}, false},
		{"Sapphire Rapids", "processor\t: 0\nvendor_id\t: GenuineIntel\nflags\t\t: avx2 avx512f avx512_bf16 amx_bf16 amx_tile\n",
			CPUBF16{Vendor: "GenuineIntel", AVX512BF16: true, AMXBF16: true, Read: true}, true},
		// A virtual machine that hides AMX: oneDNN's AVX-512 bfloat16 kernels, slower than float32 there.
		{"Xeon without AMX", "processor\t: 0\nvendor_id\t: GenuineIntel\nflags\t\t: avx512f avx512_bf16 avx512_fp16\n" +
			"processor\t: 1\nvendor_id\t: AuthenticAMD\n",
			CPUBF16{Vendor: "GenuineIntel", AVX512BF16: true, Read: true}, false},
		{"Zen 4", "vendor_id : AuthenticAMD\nflags : avx512f avx512_bf16\nflags : none\n",
			CPUBF16{Vendor: "AuthenticAMD", AVX512BF16: true, Read: true}, true},
		{"AVX512-BF16, vendor unknown", "flags : avx512f avx512_bf16\n", CPUBF16{AVX512BF16: true, Read: true}, false},
		{"no flags line (not x86)", "processor\t: 0\nFeatures\t: fp asimd bf16\n", CPUBF16{}, false},
	} {
		path := filepath.Join(dir, tc.name)
		if err := os.WriteFile(path, []byte(tc.cpuinfo), 0o644); err != nil {
			t.Fatal(err)
		}
		if got := cpuBF16From(path); got != tc.want || got.Supported() != tc.supported {
			t.Errorf("%s: %+v (%s) supported %v, want %+v supported %v", tc.name, got, got, got.Supported(), tc.want, tc.supported)
		}
	}
	if got := cpuBF16From(filepath.Join(dir, "missing")); got.Read {
		t.Errorf("a missing file reads as %+v", got)
	}
}

// This machine's own /proc/cpuinfo: on Linux x86-64 every processor has a vendor_id and a flags
// line, so the rule --amp applies (CPUBF16.Supported) has both to go by.
func TestDetectCPUBF16ReadsThisMachinesVendorAndFlags(t *testing.T) {
	if runtime.GOOS != "linux" || runtime.GOARCH != "amd64" {
		t.Skipf("/proc/cpuinfo's vendor_id and flags lines are Linux x86-64's (%s/%s)", runtime.GOOS, runtime.GOARCH)
	}
	if c := DetectCPUBF16(); !c.Read || c.Vendor == "" {
		t.Fatalf("read %+v (%s) from /proc/cpuinfo: want its flags and vendor_id", c, c)
	}
}

// Float16 through Go: the contract's initial scale is set at Load; an overflowed gradient (an
// infinity injected into the summed buffer Apply gets) skips the step, halves the scale and
// leaves weights, Adam slots and global step as they were (the checkpoint of the state before
// and after is byte for byte the same).
func TestFloat16OverflowSkipsTheStepAndHalvesTheLossScale(t *testing.T) {
	m := loadFixtureIn(t, Float16)
	if m.Precision() != Float16 {
		t.Fatalf("precision %v", m.Precision())
	}
	initial := m.Contract().LossScale.Initial
	if initial != 32768 || m.Contract().LossScale.GrowthInterval != 2000 {
		t.Fatalf("contract loss scale %+v, want LossScaleOptimizer's 2^15 and 2000", m.Contract().LossScale)
	}
	rng := newRand()
	grads := m.NewFlatTensors()
	st, err := m.TrainStep(separableBatch(rng, 8), DropoutSeed{1, 0}, grads)
	if err != nil {
		t.Fatal(err)
	}
	// The gradients are those of loss x 2^15: far larger than float32's gradients of the loss
	// (whose global norm is below 10 for this model).
	if n := norm(grads.Data); !(n > 1000) || !(st.Loss > 0.1 && st.Loss < 2) {
		t.Fatalf("gradient norm %v, loss %v: want a scaled norm and an unscaled loss", n, st.Loss)
	}
	r, err := m.Apply(grads, 0.5, 1e-2, 1)
	if err != nil || !r.Applied || r.LossScale != initial || !(r.GlobalNorm < 10) {
		t.Fatalf("finite step: %+v, %v; want applied, scale %v, the unscaled norm", r, err, initial)
	}
	save := func(name string) []byte {
		prefix := filepath.Join(t.TempDir(), name)
		written, err := m.Save(prefix)
		if err != nil {
			t.Fatal(err)
		}
		b, err := os.ReadFile(written + ".data-00000-of-00001")
		if err != nil {
			t.Fatal(err)
		}
		return b
	}
	before := save("before")
	if _, err := m.TrainStep(separableBatch(rng, 8), DropoutSeed{1, 1}, grads); err != nil {
		t.Fatal(err)
	}
	grads.Parts[3][0] = float32(math.Inf(1))
	for i, want := range []float32{initial / 2, initial / 4} {
		r, err := m.Apply(grads, 0.5, 1e-2, 1)
		if err != nil || r.Applied || r.LossScale != want || r.GlobalStep != 1 {
			t.Errorf("overflow %d: %+v, %v; want skipped, scale %v, global step 1", i+1, r, err, want)
		}
	}
	if !bytes.Equal(before, save("after")) {
		t.Error("a skipped step changed the weights, the Adam slots or the global step")
	}
}

// A checkpoint written in one precision restores in another, both ways (16-bit to float32 and
// float32 to 16-bit), with the same values, and TensorFlow reads every tensor of it as float32
// (global_step int64).
func TestCheckpointsCrossPrecisions(t *testing.T) {
	for _, tc := range []struct{ from, to Precision }{{Float16, Float32}, {Float32, BFloat16}} {
		t.Run(tc.from.String()+"-to-"+tc.to.String(), func(t *testing.T) {
			a := loadFixtureIn(t, tc.from)
			rng := rand.New(rand.NewPCG(3, 4))
			grads := a.NewFlatTensors()
			for step := range 2 {
				if _, err := a.TrainStep(separableBatch(rng, 8), DropoutSeed{2, int64(step)}, grads); err != nil {
					t.Fatal(err)
				}
				if r, err := a.Apply(grads, 1, 1e-2, 1); err != nil || !r.Applied {
					t.Fatalf("step %d: %+v, %v", step, r, err)
				}
			}
			prefix := filepath.Join(t.TempDir(), "model.ckpt-2")
			if _, err := a.Save(prefix); err != nil {
				t.Fatal(err)
			}
			b := loadFixtureIn(t, tc.to)
			if err := b.Restore(prefix); err != nil {
				t.Fatal(err)
			}
			va, vb := a.NewFlatTensors(), b.NewFlatTensors()
			if err := a.ReadVariables(va); err != nil {
				t.Fatal(err)
			}
			if err := b.ReadVariables(vb); err != nil {
				t.Fatal(err)
			}
			if step, err := b.GlobalStep(); err != nil || step != 2 || !slices.Equal(va.Data, vb.Data) {
				t.Errorf("restored global step %d (%v), variables equal: %v", step, err, slices.Equal(va.Data, vb.Data))
			}
			if _, err := b.TrainStep(separableBatch(rng, 8), DropoutSeed{2, 2}, grads); err != nil {
				t.Fatal(err)
			}
			if r, err := b.Apply(grads, 1, 1e-2, 1); err != nil || !r.Applied || r.GlobalStep != 3 {
				t.Errorf("step after restore: %+v, %v", r, err)
			}
			out, err := venvPython("-c", `
import json, sys
import tensorflow as tf
json.dump({n: d.name for n, d in tf.train.load_checkpoint(sys.argv[1]).get_variable_to_dtype_map().items()}, sys.stdout)
`, prefix)
			if err != nil {
				t.Fatal(err)
			}
			var dtypes map[string]string
			if err := json.Unmarshal(out, &dtypes); err != nil {
				t.Fatal(err)
			}
			if len(dtypes) != 3*len(a.Variables())+1 {
				t.Errorf("%d tensors in the checkpoint, want %d", len(dtypes), 3*len(a.Variables())+1)
			}
			for name, d := range dtypes {
				if want := map[bool]string{true: "int64", false: "float32"}[name == "global_step"]; d != want {
					t.Errorf("%s is %s in the checkpoint, want %s", name, d, want)
				}
			}
		})
	}
}

func TestAMPPrecisionChoosesByHardware(t *testing.T) {
	none, amx := CPUBF16{Vendor: "AuthenticAMD", Read: true}, CPUBF16{Vendor: "GenuineIntel", AMXBF16: true, Read: true}
	zen4 := CPUBF16{Vendor: "AuthenticAMD", AVX512BF16: true, Read: true}
	xeonWithoutAMX := CPUBF16{Vendor: "GenuineIntel", AVX512BF16: true, Read: true}
	for _, tc := range []struct {
		amp   string
		gpu   bool
		cpu   CPUBF16
		want  Precision
		words string
	}{
		{"", false, amx, Float32, "--amp off"},
		{"false", true, amx, Float32, "--amp off"},
		{"true", true, none, Float16, "loss scaling"},
		{"true", true, amx, Float16, "loss scaling"}, // a GPU computes, whatever its host CPU has
		{"true", false, amx, BFloat16, "GenuineIntel: avx512_bf16 no, amx_bf16 yes"},
		{"true", false, zen4, BFloat16, "AuthenticAMD: avx512_bf16 yes"},
		{"true", false, none, Float32, "lacks AVX512-BF16 and AMX (AuthenticAMD: avx512_bf16 no, amx_bf16 no), where bfloat16 runs slower than float32"},
		{"true", false, xeonWithoutAMX, Float32, "AVX512-BF16 without AMX (GenuineIntel: avx512_bf16 yes, amx_bf16 no), which pays on AMD's cores only (on Intel's, oneDNN's bfloat16 products run at about half float32's rate"},
		{"bf16", false, xeonWithoutAMX, BFloat16, "forced; CPU: GenuineIntel: avx512_bf16 yes, amx_bf16 no): slower than float32 on this CPU"},
		{"bf16", false, zen4, BFloat16, "forced; CPU: AuthenticAMD: avx512_bf16 yes, amx_bf16 no)"},
		{"fp16", true, none, Float16, "forced; CPU: AuthenticAMD: avx512_bf16 no, amx_bf16 no)"},
		{"bf16", false, none, BFloat16, "forced; CPU: AuthenticAMD: avx512_bf16 no, amx_bf16 no): slower than float32 on this CPU"},
		{"fp16", false, none, Float16, "forced; CPU: AuthenticAMD: avx512_bf16 no, amx_bf16 no): float16 on a CPU tests the loss scaling and runs slower than float32"},
	} {
		got, why, err := AMPPrecision(tc.amp, tc.gpu, tc.cpu)
		// A reason warns of a slower precision exactly where the words expected say so.
		if err != nil || got != tc.want || !strings.Contains(why, tc.words) || strings.Contains(why, "slower") != strings.Contains(tc.words, "slower") {
			t.Errorf("--amp=%q gpu %v %s: %v %q %v; want %v, a reason with %q", tc.amp, tc.gpu, tc.cpu, got, why, err, tc.want, tc.words)
		}
	}
	if _, _, err := AMPPrecision("fp8", false, none); err == nil || !strings.Contains(err.Error(), "--amp=fp8") {
		t.Errorf("--amp=fp8: %v", err)
	}
}
