package bertgraph

import (
	"bufio"
	"fmt"
	"os"
	"slices"
	"strings"
)

// Precision is the dtype train_step computes its matrix products in. Weights, optimizer slots,
// gradients, checkpoints and everything element-wise stay float32 in every precision, so a
// checkpoint of one precision restores in another.
type Precision int

const (
	// Float32 is full precision.
	Float32 Precision = iota
	// BFloat16 runs the matrix products in bfloat16: float32's range, so no loss scaling. It
	// pays on CPUs with AMX and on AMD's with AVX512-BF16 (CPUBF16.Supported); elsewhere
	// TensorFlow runs it, only slower.
	BFloat16
	// Float16 runs the matrix products in float16 with dynamic loss scaling (GPUs).
	Float16
)

// ParsePrecision reads "float32", "bfloat16" or "float16" (or "fp32", "bf16", "fp16").
func ParsePrecision(s string) (Precision, error) {
	switch strings.ToLower(s) {
	case "float32", "fp32":
		return Float32, nil
	case "bfloat16", "bf16":
		return BFloat16, nil
	case "float16", "fp16":
		return Float16, nil
	}
	return Float32, fmt.Errorf("bertgraph: precision %q is none of float32, bfloat16, float16", s)
}

func (p Precision) String() string {
	switch p {
	case BFloat16:
		return "bfloat16"
	case Float16:
		return "float16"
	}
	return "float32"
}

// trainStep is the train_step signature of the precision.
func (p Precision) trainStep() string {
	switch p {
	case BFloat16:
		return SigTrainStepBFloat16
	case Float16:
		return SigTrainStepFloat16
	}
	return SigTrainStep
}

// CPUBF16 is what the CPU offers bfloat16 matrix products: its vendor and the flags from
// /proc/cpuinfo (Linux's names) that oneDNN's bfloat16 kernels use.
type CPUBF16 struct {
	Vendor     string // vendor_id: GenuineIntel, AuthenticAMD, ...
	AVX512BF16 bool   // avx512_bf16: VDPBF16PS dot products (Cooper Lake, Zen 4 and later)
	AMXBF16    bool   // amx_bf16: AMX tiles (Sapphire Rapids and later)
	// Read says whether the flags could be read at all (Linux on x86-64).
	Read bool
}

// vendorAMD is AMD's vendor_id.
const vendorAMD = "AuthenticAMD"

// Supported says whether bfloat16 products run faster than float32 ones on this CPU, by what
// make bench-amp measured (docs/mixed-precision.md): with AMX tiles (an Intel Xeon: the step
// 1.74x float32's), and with AVX512-BF16 on AMD's cores (EPYC of families 25 and 26: 1.46-1.61x).
// AVX512-BF16 alone on an Intel core is not enough: on a Xeon with AVX512-BF16 and
// AVX512-FP16 but no AMX, oneDNN's bfloat16 products ran at half the rate of its float32 ones
// (a [2048x1536]x[1536x384] product 107 against 204 GFLOP/s, one thread) and the train step at
// 0.67x float32's speed. A vendor not measured counts as Intel: float32 is the choice that
// cannot be the slower one.
func (c CPUBF16) Supported() bool { return c.AMXBF16 || c.AVX512BF16 && c.Vendor == vendorAMD }

func (c CPUBF16) String() string {
	if !c.Read {
		return "CPU flags unknown (no /proc/cpuinfo flags line)"
	}
	yes := func(b bool) string {
		if b {
			return "yes"
		}
		return "no"
	}
	vendor := c.Vendor
	if vendor == "" {
		vendor = "vendor unknown"
	}
	return fmt.Sprintf("%s: avx512_bf16 %s, amx_bf16 %s", vendor, yes(c.AVX512BF16), yes(c.AMXBF16))
}

// DetectCPUBF16 reads the first processor's flags from /proc/cpuinfo.
func DetectCPUBF16() CPUBF16 { return cpuBF16From("/proc/cpuinfo") }

func cpuBF16From(path string) CPUBF16 {
	f, err := os.Open(path)
	if err != nil {
		return CPUBF16{}
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 0, 64<<10), 1<<20)
	var vendor string // the first processor's vendor_id line comes before its flags line
	for sc.Scan() {
		key, value, ok := strings.Cut(sc.Text(), ":")
		if !ok {
			continue
		}
		switch strings.TrimSpace(key) {
		case "vendor_id":
			if vendor == "" {
				vendor = strings.TrimSpace(value)
			}
		case "flags":
			flags := strings.Fields(value)
			return CPUBF16{Vendor: vendor, AVX512BF16: slices.Contains(flags, "avx512_bf16"),
				AMXBF16: slices.Contains(flags, "amx_bf16"), Read: true}
		}
	}
	return CPUBF16{}
}

// AMPPrecision resolves an --amp setting: "" or "false" is Float32; "true" chooses by the
// hardware (float16 with loss scaling on a GPU, bfloat16 on a CPU where it runs faster
// (CPUBF16.Supported: AMX, or AVX512-BF16 on AMD), else float32, since bfloat16 products run
// slower than float32 ones there); a precision name (ParsePrecision) forces it. The second
// result says what was chosen and why, for the log.
func AMPPrecision(amp string, onGPU bool, cpu CPUBF16) (Precision, string, error) {
	switch strings.ToLower(amp) { // absl's booleans: true, t, 1 and false, f, 0, in any case
	case "", "false", "f", "0":
		return Float32, "float32 (--amp off)", nil
	case "true", "t", "1":
		switch {
		case onGPU:
			return Float16, "float16 matrix products with dynamic loss scaling (--amp on a GPU)", nil
		case cpu.Supported():
			return BFloat16, fmt.Sprintf("bfloat16 matrix products (--amp; the CPU has %s)", cpu), nil
		case cpu.AVX512BF16:
			return Float32, fmt.Sprintf("float32: --amp asked for bfloat16, but the CPU has AVX512-BF16 without AMX (%s), which pays on AMD's cores only (on Intel's, oneDNN's bfloat16 products run at about half float32's rate; --amp=bf16 forces it)", cpu), nil
		}
		return Float32, fmt.Sprintf("float32: --amp asked for bfloat16, but the CPU lacks AVX512-BF16 and AMX (%s), where bfloat16 runs slower than float32 (--amp=bf16 forces it)", cpu), nil
	}
	p, err := ParsePrecision(amp)
	if err != nil {
		return Float32, "", fmt.Errorf("--amp=%s: want true, false, bf16 or fp16", amp)
	}
	why := fmt.Sprintf("%s matrix products (--amp=%s forced; CPU: %s)", p, amp, cpu)
	switch {
	case onGPU: // a GPU computes: what the CPU runs slower does not matter
	case p == BFloat16 && !cpu.Supported():
		why += ": slower than float32 on this CPU"
	case p == Float16:
		// make bench-amp: 0.81-0.96x float32's step on the CPUs with oneDNN float16 kernels for
		// every product, 0.01x (95 s) where a product with its bias fused has none (AVX512-FP16
		// without AMX: oneDNN's reference inner_product).
		why += ": float16 on a CPU tests the loss scaling and runs slower than float32, up to 100x where oneDNN lacks a float16 kernel for a product with its bias"
	}
	return p, why, nil
}
