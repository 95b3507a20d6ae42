package main

import (
	"fmt"
	"math/big"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
)

// checkHosts: hosts a parser accepted are named, have slots, are listed once, and count their
// slots without overflow; written as mpirun's -H (and read back as horovodrun's) or as a host
// file they are the same hosts.
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
	var b strings.Builder
	for _, h := range hosts {
		fmt.Fprintf(&b, "%s slots=%d\n", h.name, h.slots)
	}
	path := filepath.Join(t.TempDir(), "hosts")
	if err := os.WriteFile(path, []byte(b.String()), 0o644); err != nil {
		t.Fatal(err)
	}
	if back, err := parseHostfile(path); err != nil || !reflect.DeepEqual(back, hosts) {
		t.Fatalf("%s: %+v written as %q read back as %+v (%v)", from, hosts, b.String(), back, err)
	}
}

func FuzzParseHosts(f *testing.F) {
	for _, s := range []string{"a:2,b:2", "localhost:4", "fe80::1:2,[::1]:1", "a\nb:1", "a#b:1", "a:x", "a:2,a:1", "", "a", "a:0"} {
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
		checkHosts(t, fmt.Sprintf("hostfile %q", text), hosts)
	})
}

// shellSyntax is what a shell reads in --mpi-args beyond quotes, backslashes and blanks
// (expansions, operators, comments, and a newline's end of command), which splitWords takes
// literally: inputs holding any are not compared with sh.
const shellSyntax = "$`*?[]~#;&|<>(){}!\n\x00"

// FuzzSplitWords: splitWords reads what shellLine writes back as the same words, and reads
// what sh reads (where sh would expand nothing) as sh does.
func FuzzSplitWords(f *testing.F) {
	for _, s := range []string{
		`--mca btl tcp,self`, `  -x  A=1  `, `-x 'A=a b' -x "B=c d"`, `a'b'"c"d`, `"x\"y" 'p\q' r\ s`,
		`"\\ \a"`, `''`, `"" x`, "tab\tsep", `--map-by ppr:6:node`, `'open`, `"open`, `trailing\`,
	} {
		f.Add(s)
	}
	sh, _ := exec.LookPath("sh")
	f.Fuzz(func(t *testing.T, s string) {
		words, err := splitWords(s)
		if err != nil {
			return
		}
		if back, err := splitWords(shellLine(words)); err != nil || !reflect.DeepEqual(back, words) {
			t.Fatalf("splitWords(%q) = %q, written as %s and read back as %q (%v)", s, words, shellLine(words), back, err)
		}
		if sh == "" || strings.ContainsAny(s, shellSyntax) {
			return
		}
		out, err := exec.Command(sh, "-c", `eval "set -- $1"; for w in "$@"; do printf '%s\0' "$w"; done`, "sh", s).Output()
		if err != nil {
			t.Fatalf("sh reading %q: %v", s, err)
		}
		var want []string
		if len(out) > 0 {
			want = strings.Split(strings.TrimSuffix(string(out), "\x00"), "\x00")
		}
		if !reflect.DeepEqual(words, want) {
			t.Fatalf("splitWords(%q) = %q, sh reads %q", s, words, want)
		}
	})
}
