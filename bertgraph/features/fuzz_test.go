package features

import (
	"os"
	"path/filepath"
	"testing"
)

// FuzzReader: any file content, any shard, skipping bad lines: no panic, and the ranks' read
// and skipped counts add up to the data lines.
func FuzzReader(f *testing.F) {
	f.Add([]byte("0\tgood\n1\tok\n"), false)
	f.Add([]byte("\ufeff0\tbom\r\n\n\tx\n1\t\xff\n2"), false)
	f.Add([]byte("sentence\tlabel\nhello\t1\nbad\n"), true)
	labels, err := NewLabels([]string{"0", "1"})
	if err != nil {
		f.Fatal(err)
	}
	f.Fuzz(func(t *testing.T, data []byte, glue bool) {
		path := filepath.Join(t.TempDir(), "in.tsv")
		if err := os.WriteFile(path, data, 0o644); err != nil {
			t.Fatal(err)
		}
		format := FormatSeed
		if glue {
			format = FormatGLUE
		}
		lines, sum := -1, 0
		for rank := range 3 {
			_, counts, err := readAll(t, path, ReadOptions{Format: format, Rank: rank, Size: 3, Labels: labels, SkipBad: true})
			if err != nil {
				return // a GLUE header can be unusable; data lines are skipped, never errors
			}
			if lines >= 0 && counts.Lines != lines {
				t.Fatalf("ranks saw %d and %d lines", lines, counts.Lines)
			}
			lines = counts.Lines
			sum += counts.Read + counts.Skipped
		}
		if sum != lines {
			t.Fatalf("read+skipped %d over ranks, %d data lines", sum, lines)
		}
	})
}
