package main

import (
	"fmt"
	"math/big"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
)

// checkHosts: hosts a parser accepted are named, have slots, are listed once, and count their
// slots without overflow; written as mpirun's -H (and read back as horovodrun's) they are the
// same hosts.
func checkHosts(t *testing.T, from string, hosts []host) {
	t.Helper()
	seen := map[string]bool{}
	sum := new(big.Int)
	for _, h := range hosts {
		if h.name == "" || h.slots < 1 || seen[h.name] {
			t.Fatalf("%s: accepted %+v", from, hosts)
		}
		seen[h.name] = true
		sum.Add(sum, big.NewInt(int64(h.slots)))
	}
	if total := totalSlots(hosts); sum.Cmp(big.NewInt(int64(total))) != 0 {
		t.Fatalf("%s: %+v count %d slots, not %v", from, hosts, total, sum)
	}
	back, err := parseHosts(hostList(hosts))
	if err != nil || !reflect.DeepEqual(back, hosts) {
		t.Fatalf("%s: %+v become -H %q, read back as %+v (%v)", from, hosts, hostList(hosts), back, err)
	}
}

func FuzzParseHosts(f *testing.F) {
	for _, s := range []string{"a:2,b:2", "localhost:4", "fe80::1:2,[::1]:1", "a:x", "a:2,a:1", "", "a", "a:0"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, spec string) {
		if hosts, err := parseHosts(spec); err == nil {
			checkHosts(t, fmt.Sprintf("-H %q", spec), hosts)
		}
	})
}

func FuzzParseHostfile(f *testing.F) {
	for _, s := range []string{
		"# the cluster\nhost1 slots=4\n\n  host2   slots=2   # the small one\n",
		"host1 slots=2\nhost2 max_slots=4\n", "host1 slots=0\n", "a slots=1\nb slots=1\na slots=2\n", "", "a slots=1\r\n",
	} {
		f.Add(s)
	}
	path := filepath.Join(f.TempDir(), "hosts")
	f.Fuzz(func(t *testing.T, text string) {
		if err := os.WriteFile(path, []byte(text), 0o644); err != nil {
			t.Fatal(err)
		}
		hosts, err := parseHostfile(path)
		if err != nil {
			return
		}
		from := fmt.Sprintf("hostfile %q", text)
		checkHosts(t, from, hosts)
		var b strings.Builder
		for _, h := range hosts {
			fmt.Fprintf(&b, "%s slots=%d\n", h.name, h.slots)
		}
		if err := os.WriteFile(path, []byte(b.String()), 0o644); err != nil {
			t.Fatal(err)
		}
		if back, err := parseHostfile(path); err != nil || !reflect.DeepEqual(back, hosts) {
			t.Fatalf("%s: %+v written as %q read back as %+v (%v)", from, hosts, b.String(), back, err)
		}
	})
}
