package tf

import (
	"bufio"
	"bytes"
	"encoding/base64"
	"encoding/json"
	"os/exec"
	"slices"
	"testing"

	"github.com/gorovod/gorovod/tf/testenv"
)

// TestConfigProtoDecodedByPython decodes our ConfigProto bytes with Python TensorFlow's
// ConfigProto and checks every field we set, and that TensorFlow re-serializes them to the
// same bytes (so no field went to a wrong number and came back as unknown).
func TestConfigProtoDecodedByPython(t *testing.T) {
	cases := []SessionOptions{
		{},
		{IntraOpThreads: 4, InterOpThreads: 2},
		{AllowSoftPlacement: true, LogDevicePlacement: true},
		{GPU: GPUOptions{AllowGrowth: true, VisibleDeviceList: "1,0", PerProcessMemoryFraction: 0.45}},
		{GlobalJitLevel: JitOff},
		{GlobalJitLevel: JitOn2, AutoMixedPrecision: ToggleOn},
		{AutoMixedPrecision: ToggleOff},
		{IntraOpThreads: 1, InterOpThreads: 1, AllowSoftPlacement: true, GPU: GPUOptions{AllowGrowth: true, VisibleDeviceList: "3"},
			GlobalJitLevel: JitOn1, AutoMixedPrecision: ToggleAggressive},
	}
	var stdin bytes.Buffer
	for _, o := range cases {
		stdin.WriteString(base64.StdEncoding.EncodeToString(o.ConfigProto()) + "\n")
	}
	cmd := exec.Command(testenv.VenvPython.Require(t), "testdata/decode_config.py")
	cmd.Stdin = &stdin
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("decode_config.py: %v\n%s", err, stderr.String())
	}
	lines := bufio.NewScanner(bytes.NewReader(out))
	for i, o := range cases {
		if !lines.Scan() {
			t.Fatalf("case %d: no output from Python", i)
		}
		var got struct {
			Intra, Inter        int32
			AllowSoft, LogPlace bool
			AllowGrowth         bool
			Visible             string
			Fraction            float64
			Jit, AMP            int32
			SetFields           []string
			Reserialized        []byte
		}
		var raw map[string]json.RawMessage
		if err := json.Unmarshal(lines.Bytes(), &raw); err != nil {
			t.Fatal(err)
		}
		for key, dst := range map[string]any{
			"intra_op_parallelism_threads": &got.Intra, "inter_op_parallelism_threads": &got.Inter,
			"allow_soft_placement": &got.AllowSoft, "log_device_placement": &got.LogPlace,
			"allow_growth": &got.AllowGrowth, "visible_device_list": &got.Visible,
			"per_process_gpu_memory_fraction": &got.Fraction, "global_jit_level": &got.Jit,
			"auto_mixed_precision": &got.AMP, "set_fields": &got.SetFields, "reserialized": &got.Reserialized,
		} {
			if err := json.Unmarshal(raw[key], dst); err != nil {
				t.Fatalf("case %d: field %s: %v", i, key, err)
			}
		}
		if got.Intra != o.IntraOpThreads || got.Inter != o.InterOpThreads || got.AllowSoft != o.AllowSoftPlacement ||
			got.LogPlace != o.LogDevicePlacement || got.AllowGrowth != o.GPU.AllowGrowth ||
			got.Visible != o.GPU.VisibleDeviceList || got.Fraction != o.GPU.PerProcessMemoryFraction ||
			got.Jit != int32(o.GlobalJitLevel) || got.AMP != int32(o.AutoMixedPrecision) {
			t.Errorf("case %d: Python read %+v from %+v", i, got, o)
		}
		if !bytes.Equal(got.Reserialized, o.ConfigProto()) {
			t.Errorf("case %d: Python re-serializes to %x, we wrote %x", i, got.Reserialized, o.ConfigProto())
		}
		// Only the messages we mean to touch are present.
		for _, f := range got.SetFields {
			if !slices.Contains([]string{"intra_op_parallelism_threads", "inter_op_parallelism_threads",
				"allow_soft_placement", "log_device_placement", "gpu_options", "graph_options"}, f) {
				t.Errorf("case %d: unexpected field %s set", i, f)
			}
		}
	}
}

// TestSessionOptionsAccepted starts sessions with non-default options: TensorFlow parses the
// ConfigProto (TF_SetConfig fails on bytes it cannot parse).
func TestSessionOptionsAccepted(t *testing.T) {
	g := NewGraph()
	defer g.Close()
	if err := g.Import(identityGraphDef(Float, nil), ""); err != nil {
		t.Fatal(err)
	}
	for _, o := range []*SessionOptions{
		nil,
		{IntraOpThreads: 1, InterOpThreads: 1, AllowSoftPlacement: true, GlobalJitLevel: JitOff, AutoMixedPrecision: ToggleOff},
		{GPU: GPUOptions{AllowGrowth: true}},
	} {
		s, err := NewSession(g, o)
		if err != nil {
			t.Fatalf("%+v: %v", o, err)
		}
		if err := s.Close(); err != nil {
			t.Fatal(err)
		}
	}
}
