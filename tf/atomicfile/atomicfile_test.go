package atomicfile

import (
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
)

func TestContentAppearsOnlyAtCommit(t *testing.T) {
	dir := t.TempDir()
	p := filepath.Join(dir, "f.txt")
	os.WriteFile(p, []byte("old"), 0o644)
	f, err := Create(p)
	if err != nil {
		t.Fatal(err)
	}
	f.WriteString("new content")
	if b, _ := os.ReadFile(p); string(b) != "old" {
		t.Fatalf("before commit: %q", b)
	}
	if err := f.Commit(); err != nil {
		t.Fatal(err)
	}
	f.Abort() // no-op after commit
	if b, _ := os.ReadFile(p); string(b) != "new content" {
		t.Fatalf("after commit: %q", b)
	}
	if err := f.Commit(); err == nil {
		t.Fatal("second commit accepted")
	}
	g, _ := Create(p)
	g.WriteString("discarded")
	g.Abort()
	entries, _ := os.ReadDir(dir)
	if b, _ := os.ReadFile(p); string(b) != "new content" || len(entries) != 1 {
		t.Fatalf("after abort: %q, %d entries", b, len(entries))
	}
	if err := Write(filepath.Join(dir, "missing", "x"), nil); err == nil {
		t.Fatal("write into a missing directory succeeded")
	}
}

// TestModeIsThatOfOSCreate checks that a committed file gets 0666 less the umask, as a file
// made by os.Create in the same directory does, under two umasks.
func TestModeIsThatOfOSCreate(t *testing.T) {
	dir := t.TempDir()
	for _, umask := range []int{0o022, 0o027} {
		old := syscall.Umask(umask)
		p := filepath.Join(dir, fmt.Sprintf("results-%o", umask))
		err := Write(p, []byte("x"))
		ref, rerr := os.Create(filepath.Join(dir, fmt.Sprintf("reference-%o", umask)))
		syscall.Umask(old)
		if err != nil || rerr != nil {
			t.Fatal(err, rerr)
		}
		refInfo, _ := ref.Stat()
		ref.Close()
		info, err := os.Stat(p)
		if err != nil {
			t.Fatal(err)
		}
		want := os.FileMode(0o666 &^ umask)
		if info.Mode().Perm() != want || refInfo.Mode().Perm() != want {
			t.Errorf("umask %04o: mode %v, os.Create's %v, want %v", umask, info.Mode().Perm(), refInfo.Mode().Perm(), want)
		}
	}
}

// RemoveStale removes what writers of the path killed before Commit or Abort left, and nothing
// else: not the file, not another file's temporaries, even where the name holds pattern
// characters.
func TestRemoveStale(t *testing.T) {
	dir := t.TempDir()
	for _, name := range []string{"f.txt", "[f].txt"} {
		p := filepath.Join(dir, name)
		if err := Write(p, []byte("kept")); err != nil {
			t.Fatal(err)
		}
		for range 2 {
			f, err := Create(p) // a writer killed here leaves its temporary file
			if err != nil {
				t.Fatal(err)
			}
			f.WriteString("half")
			f.Flush()
		}
	}
	other := filepath.Join(dir, ".g.txt.tmp1")
	os.WriteFile(other, nil, 0o644)
	if err := RemoveStale(filepath.Join(dir, "f.txt")); err != nil {
		t.Fatal(err)
	}
	var left []string
	entries, _ := os.ReadDir(dir)
	for _, e := range entries {
		left = append(left, e.Name())
	}
	if len(left) != 5 || !slices.Contains(left, "f.txt") || !slices.Contains(left, ".g.txt.tmp1") || slices.ContainsFunc(left, func(n string) bool { return strings.HasPrefix(n, ".f.txt.tmp") }) {
		t.Fatalf("after RemoveStale of f.txt: %q; want f.txt, [f].txt with its 2 temporaries and .g.txt.tmp1", left)
	}
	if err := RemoveStale(filepath.Join(dir, "[f].txt")); err != nil {
		t.Fatal(err)
	}
	if entries, _ := os.ReadDir(dir); len(entries) != 3 {
		t.Fatalf("after RemoveStale of [f].txt: %d entries, want 3", len(entries))
	}
}
