package testenv

import (
	"fmt"
	"os"
	"strings"
	"testing"
)

// outcome records how Require ended a test, in place of the real testing.T's Skip and Fatal.
type outcome struct {
	testing.TB
	skipped, failed string
}

func (o *outcome) Helper()              {}
func (o *outcome) Skip(args ...any)     { o.skipped = fmt.Sprint(args...) }
func (o *outcome) Fatal(args ...any)    { o.failed = fmt.Sprint(args...) }
func (o *outcome) Skipf(string, ...any) { panic("unused") }

// A missing fixture skips the test, naming it and its make target, unless GOROVOD_TEST_REQUIRE
// is set: then it fails it. A present one is returned as an absolute path.
func TestRequireSkipsOrFailsOnAMissingFixture(t *testing.T) {
	missing := Fixture{Rel: "no/such/fixture", What: "the fixture of this test", Target: "make nothing"}
	for _, require := range []string{"", "1"} {
		t.Setenv(RequireVar, require)
		var o outcome
		missing.Require(&o)
		msg := o.skipped
		if require != "" {
			msg = o.failed
		}
		if (o.skipped != "") == (o.failed != "") || !strings.Contains(msg, "the fixture of this test is missing") || !strings.Contains(msg, "make nothing") {
			t.Errorf("%s=%q: skipped %q, failed %q", RequireVar, require, o.skipped, o.failed)
		}
	}
	var o outcome
	if got := (Fixture{Rel: "go.mod"}).Require(&o); got != Root()+"/go.mod" || o.skipped != "" || o.failed != "" {
		t.Errorf("go.mod: %q, skipped %q, failed %q", got, o.skipped, o.failed)
	}
}

// CPU names the processor that /proc/cpuinfo describes and only instruction sets it lists.
func TestCPUNamesTheProcessor(t *testing.T) {
	b, err := os.ReadFile("/proc/cpuinfo")
	if err != nil {
		t.Skip("no /proc/cpuinfo on this system")
	}
	got := CPU()
	model := ""
	for _, line := range strings.Split(string(b), "\n") {
		if k, v, ok := strings.Cut(line, ":"); ok && strings.TrimSpace(k) == "model name" {
			model = strings.TrimSpace(v)
			break
		}
	}
	if model != "" && !strings.Contains(got, model) {
		t.Errorf("CPU() = %q, want the model name %q", got, model)
	}
	for _, f := range []string{"avx512_bf16", "amx_bf16"} {
		if strings.Contains(got, f) != strings.Contains(string(b), " "+f) {
			t.Errorf("CPU() = %q says %s wrongly for this machine", got, f)
		}
	}
}
