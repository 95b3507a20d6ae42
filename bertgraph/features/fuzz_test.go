package features

import (
	"os"
	"path/filepath"
	"testing"
)

// FuzzReader: any file content, any shard, skipping bad lines, in every layout (seed with and
// without labels; GLUE by header name, by index with a header, by index without one, filtered
// by a field with a label alias): no
// panic, and the ranks' read, skipped and filtered counts add up to the data lines.
func FuzzReader(f *testing.F) {
	f.Add([]byte("0\tgood\n1\tok\n"), uint8(0))
	f.Add([]byte("\ufeff0\tbom\r\n\n\tx\n1\t\xff\n2"), uint8(1))
	f.Add([]byte("sentence\tlabel\nhello\t1\nbad\n"), uint8(2))
	f.Add([]byte("index\ta\tb\tlabel\n0\tx\t\t1\n1\ty\n"), uint8(3))
	f.Add([]byte("src\t1\t\tok\nsrc\t0\n\t\t\t\n"), uint8(4))
	f.Add([]byte("language\ta\tlabel\nzh\tok\tx\nen\tno\t1\nzh\t\t0\n"), uint8(5))
	labels, err := NewLabels([]string{"0", "1"})
	if err != nil {
		f.Fatal(err)
	}
	layouts := []ReadOptions{
		{},
		{Unlabelled: true},
		{Format: FormatGLUE},
		{Format: FormatGLUE, TextA: ColumnAt(1), TextB: ColumnAt(2), Label: ColumnAt(-1)},
		{Format: FormatGLUE, NoHeader: true, TextA: ColumnAt(3), Label: ColumnAt(1)},
		{Format: FormatGLUE, TextA: ColumnAt(1), Label: ColumnAt(2), Where: Filter{ColumnAt(0), "zh"}, LabelAliases: map[string]string{"x": "1"}},
	}
	f.Fuzz(func(t *testing.T, data []byte, layout uint8) {
		path := filepath.Join(t.TempDir(), "in.tsv")
		if err := os.WriteFile(path, data, 0o644); err != nil {
			t.Fatal(err)
		}
		opts := layouts[int(layout)%len(layouts)]
		opts.Size, opts.Labels, opts.SkipBad = 3, labels, true
		lines, sum := -1, 0
		for rank := range 3 {
			opts.Rank = rank
			_, counts, err := readAll(t, path, opts)
			if err != nil {
				return // a GLUE header can be unusable; data lines are skipped, never errors
			}
			if lines >= 0 && counts.Lines != lines {
				t.Fatalf("ranks saw %d and %d lines", lines, counts.Lines)
			}
			lines = counts.Lines
			sum += counts.Read + counts.Skipped + counts.Filtered
		}
		if sum != lines {
			t.Fatalf("read+skipped %d over ranks, %d data lines", sum, lines)
		}
	})
}
