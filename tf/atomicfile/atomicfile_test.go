package atomicfile

import (
	"fmt"
	"os"
	"path/filepath"
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
