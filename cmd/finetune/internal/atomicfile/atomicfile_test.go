package atomicfile

import (
	"os"
	"path/filepath"
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
