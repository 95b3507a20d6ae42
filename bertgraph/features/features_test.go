package features

import (
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/gorovod/gorovod/bertgraph/tokenizer"
)

// vocab: ids 0..4 are [PAD] [UNK] [CLS] [SEP] [MASK]; then a b c d e f g h.
func newTok(t testing.TB) *tokenizer.Tokenizer {
	t.Helper()
	v, err := tokenizer.NewVocab(strings.Fields("[PAD] [UNK] [CLS] [SEP] [MASK] a b c d e f g h"))
	if err != nil {
		t.Fatal(err)
	}
	tok, err := tokenizer.New(v, tokenizer.Options{DoLowerCase: true})
	if err != nil {
		t.Fatal(err)
	}
	return tok
}

func newConv(t testing.TB, maxSeq int) *Converter {
	t.Helper()
	labels, err := NewLabels([]string{"neg", "pos"})
	if err != nil {
		t.Fatal(err)
	}
	c, err := NewConverter(newTok(t), maxSeq, labels)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

func TestConvertSingle(t *testing.T) {
	c := newConv(t, 8)
	f, err := c.Convert(InputExample{TextA: "A b C", Label: "pos"})
	if err != nil {
		t.Fatal(err)
	}
	want := InputFeatures{
		InputIDs:      []int32{2, 5, 6, 7, 3, 0, 0, 0},
		InputMask:     []int32{1, 1, 1, 1, 1, 0, 0, 0},
		SegmentIDs:    []int32{0, 0, 0, 0, 0, 0, 0, 0},
		LabelID:       1,
		IsRealExample: true,
	}
	checkFeatures(t, f, want)
	// Truncated to max_seq_length - 2 tokens.
	f, _ = c.Convert(InputExample{TextA: "a b c d e f g h", Label: "neg"})
	checkFeatures(t, f, InputFeatures{
		InputIDs:      []int32{2, 5, 6, 7, 8, 9, 10, 3},
		InputMask:     []int32{1, 1, 1, 1, 1, 1, 1, 1},
		SegmentIDs:    make([]int32, 8),
		IsRealExample: true,
	})
}

func TestConvertPairLongestFirst(t *testing.T) {
	c := newConv(t, 9) // 6 tokens for a and b
	cases := []struct{ a, b string }{
		{"a b c d e f", "g h"},   // a 4, b 2
		{"a b", "c d e f g h"},   // a 2, b 4
		{"a b c d", "e f g h"},   // tie: b loses first -> a 3, b 3
		{"a b c d e", "f g h"},   // a 3, b 3
		{"a", "b c d e f g h a"}, // a 1, b 5
	}
	want := [][2][]int32{
		{{5, 6, 7, 8}, {11, 12}},
		{{5, 6}, {7, 8, 9, 10}},
		{{5, 6, 7}, {9, 10, 11}},
		{{5, 6, 7}, {10, 11, 12}},
		{{5}, {6, 7, 8, 9, 10}},
	}
	for i, cs := range cases {
		f, err := c.Convert(InputExample{TextA: cs.a, TextB: cs.b, Label: "neg"})
		if err != nil {
			t.Fatal(err)
		}
		ids := append(append(append(append([]int32{2}, want[i][0]...), 3), want[i][1]...), 3)
		segs := make([]int32, 9)
		for j := 2 + len(want[i][0]); j < len(ids); j++ {
			segs[j] = 1
		}
		mask := make([]int32, 9)
		for j := range ids {
			mask[j] = 1
		}
		ids = append(ids, make([]int32, 9-len(ids))...)
		checkFeatures(t, f, InputFeatures{InputIDs: ids, InputMask: mask, SegmentIDs: segs, IsRealExample: true})
	}
}

// A text b without tokens makes a single-sequence example, as in run_classifier.
func TestConvertEmptyTextB(t *testing.T) {
	c := newConv(t, 6)
	f, err := c.Convert(InputExample{TextA: "a b c d e f", TextB: "\u200b\x00 ", Label: "neg"})
	if err != nil {
		t.Fatal(err)
	}
	checkFeatures(t, f, InputFeatures{InputIDs: []int32{2, 5, 6, 7, 8, 3}, InputMask: []int32{1, 1, 1, 1, 1, 1}, SegmentIDs: make([]int32, 6), IsRealExample: true})
}

// A text b that the truncation empties (max_seq_length 3 or 4) leaves a single sequence, as
// run_classifier decides after _truncate_seq_pair: a keeps the max_seq_length - 3 tokens the
// truncation left it and no second [SEP] follows.
func TestConvertPairTruncatedToSingle(t *testing.T) {
	for _, cs := range []struct {
		maxSeq    int
		ids, mask []int32
	}{
		{4, []int32{2, 5, 3, 0}, []int32{1, 1, 1, 0}}, // a 1, b 1: the tie takes b's token
		{3, []int32{2, 3, 0}, []int32{1, 1, 0}},       // no room for either
	} {
		f, err := newConv(t, cs.maxSeq).Convert(InputExample{TextA: "a b", TextB: "c", Label: "neg"})
		if err != nil {
			t.Fatal(err)
		}
		checkFeatures(t, f, InputFeatures{InputIDs: cs.ids, InputMask: cs.mask, SegmentIDs: make([]int32, cs.maxSeq), IsRealExample: true})
	}
}

func checkFeatures(t *testing.T, got, want InputFeatures) {
	t.Helper()
	if !slices.Equal(got.InputIDs, want.InputIDs) || !slices.Equal(got.InputMask, want.InputMask) ||
		!slices.Equal(got.SegmentIDs, want.SegmentIDs) || got.LabelID != want.LabelID || got.IsRealExample != want.IsRealExample {
		t.Errorf("features\n got %+v\nwant %+v", got, want)
	}
}

func TestConvertLabels(t *testing.T) {
	c := newConv(t, 8)
	if _, err := c.Convert(InputExample{GUID: "f:3", TextA: "a", Label: "meh"}); err == nil || !strings.Contains(err.Error(), "f:3") {
		t.Errorf("unknown label: %v, want an error naming the example", err)
	}
	f, err := c.Convert(InputExample{TextA: "a"})
	if err != nil || f.LabelID != 0 {
		t.Errorf("unlabelled: %v %v", f.LabelID, err)
	}
	l, err := SortedLabels([]string{"10", "2", "1", "2"})
	if err != nil || !slices.Equal(l.Names(), []string{"1", "2", "10"}) {
		t.Errorf("numeric labels sorted %v %v", l.Names(), err)
	}
	l, _ = SortedLabels([]string{"pos", "neg", "pos"})
	if !slices.Equal(l.Names(), []string{"neg", "pos"}) {
		t.Errorf("labels sorted %v", l.Names())
	}
	// One name that is no integer makes every name sort as a string.
	l, _ = SortedLabels([]string{"b", "9", "10"})
	if !slices.Equal(l.Names(), []string{"10", "9", "b"}) {
		t.Errorf("mixed labels sorted %v, want them as strings", l.Names())
	}
	if _, err := NewLabels([]string{"a", "a"}); err == nil {
		t.Error("duplicate label accepted")
	}
}

func TestConvertBatchPads(t *testing.T) {
	c := newConv(t, 5)
	b, err := c.ConvertBatch([]InputExample{{GUID: "x", TextA: "a", Label: "pos"}, {GUID: "y", TextA: "b c", Label: "neg"}}, 4)
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(b.InputIDs, []int32{2, 5, 3, 0, 0, 2, 6, 7, 3, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0}) ||
		!slices.Equal(b.InputMask, []int32{1, 1, 1, 0, 0, 1, 1, 1, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0}) ||
		!slices.Equal(b.SegmentIDs, make([]int32, 20)) || // no text b: every token in segment 0
		!slices.Equal(b.LabelIDs, []int32{1, 0, 0, 0}) || !slices.Equal(b.IsRealExample, []int32{1, 1, 0, 0}) ||
		b.NumReal() != 2 || !slices.Equal(b.GUIDs, []string{"x", "y"}) {
		t.Errorf("batch %+v", b)
	}
	if _, err := c.ConvertBatch(make([]InputExample, 5), 4); err == nil {
		t.Error("5 examples in a batch of 4 accepted")
	}
}

func writeFile(t testing.TB, name, body string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), name)
	if err := os.WriteFile(p, []byte(body), 0o644); err != nil {
		t.Fatal(err)
	}
	return p
}

func readAll(t testing.TB, path string, opts ReadOptions) ([]InputExample, Counts, error) {
	t.Helper()
	r, err := Open(path, opts)
	if err != nil {
		return nil, Counts{}, err
	}
	defer r.Close()
	var out []InputExample
	for {
		ex, err := r.Next()
		if err == io.EOF {
			return out, r.Counts(), nil
		}
		if err != nil {
			return out, r.Counts(), err
		}
		out = append(out, ex)
	}
}

func TestSeedReaderShards(t *testing.T) {
	var body strings.Builder
	const n = 103
	for i := range n {
		fmt.Fprintf(&body, "%d\ttext %d\twith a tab\n", i%2, i)
	}
	path := writeFile(t, "train.txt", body.String())
	for _, size := range []int{1, 2, 3, 4} {
		total := 0
		for rank := range size {
			exs, counts, err := readAll(t, path, ReadOptions{Rank: rank, Size: size})
			if err != nil {
				t.Fatal(err)
			}
			for j, ex := range exs {
				i := rank + j*size
				want := InputExample{GUID: fmt.Sprintf("%s:%d", path, i+1), TextA: fmt.Sprintf("text %d\twith a tab", i), Label: fmt.Sprint(i % 2)}
				if ex != want {
					t.Fatalf("size %d rank %d example %d = %+v, want %+v", size, rank, j, ex, want)
				}
			}
			if counts.Read != len(exs) || counts.Lines != n || counts.Skipped != 0 {
				t.Errorf("size %d rank %d counts %+v, read %d", size, rank, counts, len(exs))
			}
			total += counts.Read
		}
		if total != n {
			t.Errorf("size %d: ranks read %d examples, file has %d", size, total, n)
		}
	}
	for _, bad := range []struct{ rank, size, shown int }{{2, 2, 2}, {-1, 2, 2}, {0, -1, -1}, {1, 0, 1}} {
		want := fmt.Sprintf("features: rank %d of size %d is not a valid shard", bad.rank, bad.shown)
		if _, err := Open(path, ReadOptions{Rank: bad.rank, Size: bad.size}); err == nil || err.Error() != want {
			t.Errorf("rank %d of size %d: %v, want %q", bad.rank, bad.size, err, want)
		}
	}
	if size, err := ShardSize(0, 0); size != 1 || err != nil {
		t.Errorf("ShardSize(0, 0) = %d, %v; want 1 (size 0 is one process)", size, err)
	}
}

// MaxLines ends the file for every rank after the first MaxLines data lines: the ranks together
// read exactly those, and a bad line right after them is never read (nor counted when skipped).
func TestMaxLines(t *testing.T) {
	const limit = 7
	var body strings.Builder
	for i := range limit {
		fmt.Fprintf(&body, "%d\ttext %d\n", i%2, i)
	}
	body.WriteString("\n1\tafter the blank line\n")
	path := writeFile(t, "limited.txt", body.String())
	for _, skip := range []bool{false, true} {
		for _, size := range []int{1, 2, 3} {
			var texts []string
			for rank := range size {
				exs, counts, err := readAll(t, path, ReadOptions{Rank: rank, Size: size, SkipBad: skip, MaxLines: limit})
				if err != nil {
					t.Fatalf("size %d rank %d: %v", size, rank, err)
				}
				if counts.Lines != limit || counts.Skipped != 0 || counts.Read != len(exs) {
					t.Errorf("size %d rank %d, SkipBad %v: counts %+v", size, rank, skip, counts)
				}
				for _, ex := range exs {
					texts = append(texts, ex.TextA)
				}
			}
			slices.Sort(texts)
			var want []string
			for i := range limit {
				want = append(want, fmt.Sprintf("text %d", i))
			}
			if !slices.Equal(texts, want) {
				t.Errorf("size %d: ranks read %q, want the first %d lines", size, texts, limit)
			}
		}
	}
	// Without the limit the blank line is bad input.
	if _, _, err := readAll(t, path, ReadOptions{}); err == nil || !strings.Contains(err.Error(), "blank line") {
		t.Errorf("whole file: %v, want the blank line", err)
	}
}

func TestBadInput(t *testing.T) {
	labels, _ := NewLabels([]string{"0", "1"})
	cases := []struct {
		name, body, reason string
		line               int
	}{
		{"notab", "0\tgood\n1 no tab here\n", "no tab", 2},
		{"emptytext", "0\tgood\n1\t  \n", "empty text", 2},
		{"emptylabel", "\ttext\n", "empty label", 1},
		{"label", "0\tgood\n7\tbad label\n", `label "7" is not in the label list`, 2},
		{"utf8", "0\tgood\n1\tbad \xff byte\n", "invalid UTF-8 at byte 6", 2},
		{"crlf", "0\tgood\r\n", "CRLF", 1},
		{"cr", "0\tgood\n0\tgood\r1\tbad\r0\tworse\n", "CR (carriage return) at byte 6: CR line endings", 2},
		{"bom", "\ufeff0\tgood\n1\tok\n", "byte order mark", 1},
		{"blank", "0\tgood\n\n1\tok\n", "blank line", 2},
	}
	for _, c := range cases {
		path := writeFile(t, c.name+".txt", c.body)
		_, _, err := readAll(t, path, ReadOptions{Labels: labels})
		var le *LineError
		if !errors.As(err, &le) || le.Path != path || le.Line != c.line || !strings.Contains(le.Reason, c.reason) {
			t.Errorf("%s: err %v, want %s:%d: %s", c.name, err, path, c.line, c.reason)
		}
		if !strings.HasPrefix(err.Error(), fmt.Sprintf("%s:%d: ", path, c.line)) {
			t.Errorf("%s: message %q does not start with file:line", c.name, err)
		}
		// Skipped and counted: over two ranks, read + skipped = data lines.
		sum := 0
		for rank := range 2 {
			exs, counts, err := readAll(t, path, ReadOptions{Labels: labels, SkipBad: true, Rank: rank, Size: 2})
			if err != nil {
				t.Fatalf("%s: SkipBad: %v", c.name, err)
			}
			if counts.Read != len(exs) {
				t.Errorf("%s: counts %+v but %d examples", c.name, counts, len(exs))
			}
			sum += counts.Read + counts.Skipped
			if rank == (c.line-1)%2 && counts.Skipped != 1 {
				t.Errorf("%s rank %d: skipped %d, want 1", c.name, rank, counts.Skipped)
			}
		}
		if lines := strings.Count(c.body, "\n"); sum != lines {
			t.Errorf("%s: read+skipped = %d over ranks, want %d lines", c.name, sum, lines)
		}
	}
}

func TestGLUEReader(t *testing.T) {
	path := writeFile(t, "dev.tsv", "index\tquestion\tsentence\tlabel\n0\tWhat?\tThis.\tentailment\n1\tWho?\tHim.\tnot_entailment\n2\tWhy?\t\tentailment\n3\t\tEmpty a.\tentailment\n")
	exs, counts, err := readAll(t, path, ReadOptions{Format: FormatGLUE, TextA: ColumnNamed("question"), TextB: ColumnNamed("sentence"), SkipBad: true})
	if err != nil {
		t.Fatal(err)
	}
	// An empty text_b is a single-sequence example (run_classifier's `if example.text_b`); an
	// empty text_a is bad input.
	want := []InputExample{
		{GUID: path + ":2", TextA: "What?", TextB: "This.", Label: "entailment"},
		{GUID: path + ":3", TextA: "Who?", TextB: "Him.", Label: "not_entailment"},
		{GUID: path + ":4", TextA: "Why?", TextB: "", Label: "entailment"},
	}
	if !slices.Equal(exs, want) || counts != (Counts{Lines: 4, Read: 3, Skipped: 1}) {
		t.Errorf("got %+v %+v", exs, counts)
	}
	_, _, err = readAll(t, path, ReadOptions{Format: FormatGLUE, TextA: ColumnNamed("premise")})
	if err == nil || !strings.Contains(err.Error(), `no column "premise"`) || !strings.Contains(err.Error(), path+":1") {
		t.Errorf("missing column: %v", err)
	}
	short := writeFile(t, "short.tsv", "sentence\tlabel\nhello\t1\nworld\n")
	if _, _, err = readAll(t, short, ReadOptions{Format: FormatGLUE}); err == nil || !strings.Contains(err.Error(), short+":3: 1 tab-separated fields, the header has 2") {
		t.Errorf("short row: %v", err)
	}
	test := writeFile(t, "test.tsv", "id\tsentence\n7\thello\n")
	exs, _, err = readAll(t, test, ReadOptions{Format: FormatGLUE, Unlabelled: true})
	if err != nil || len(exs) != 1 || exs[0].Label != "" || exs[0].TextA != "hello" {
		t.Errorf("unlabelled: %+v %v", exs, err)
	}
	l, err := LabelsFromFile(path, ReadOptions{Format: FormatGLUE, TextA: ColumnNamed("question"), SkipBad: true, Rank: 1, Size: 2})
	if err != nil || !slices.Equal(l.Names(), []string{"entailment", "not_entailment"}) {
		t.Errorf("LabelsFromFile: %v %v", l, err)
	}
}

// Columns by index as run_classifier's processors pick them: CoLA's header-less train.tsv,
// MNLI's label in the last field (line[-1]), quotes read as plain characters.
func TestGLUEColumnsByIndex(t *testing.T) {
	cola := writeFile(t, "cola.tsv", "gj04\t1\t\tThe sailors rode the breeze \"clear\" of the rocks.\ngj04\t0\t*\t\"Unbalanced quote.\n")
	exs, _, err := readAll(t, cola, ReadOptions{Format: FormatGLUE, NoHeader: true, TextA: ColumnAt(3), Label: ColumnAt(1)})
	want := []InputExample{
		{GUID: cola + ":1", TextA: `The sailors rode the breeze "clear" of the rocks.`, Label: "1"},
		{GUID: cola + ":2", TextA: `"Unbalanced quote.`, Label: "0"},
	}
	if err != nil || !slices.Equal(exs, want) {
		t.Errorf("no header: %+v %v", exs, err)
	}
	short := writeFile(t, "short.tsv", "gj04\t1\t\tfine\ngj04\t0\n")
	if _, _, err := readAll(t, short, ReadOptions{Format: FormatGLUE, NoHeader: true, TextA: ColumnAt(3), Label: ColumnAt(1)}); err == nil ||
		!strings.Contains(err.Error(), short+":2: 2 tab-separated fields, no column 3 for text_a") {
		t.Errorf("no header, short line: %v", err)
	}
	if _, err := Open(cola, ReadOptions{Format: FormatGLUE, NoHeader: true}); err == nil || !strings.Contains(err.Error(), `column "sentence" by name`) {
		t.Errorf("named column without header: %v", err)
	}
	mnli := writeFile(t, "mnli.tsv", "index\tsentence1\tsentence2\tlabel1\tgold_label\n0\tA man.\tA person.\tneutral\tentailment\n")
	exs, _, err = readAll(t, mnli, ReadOptions{Format: FormatGLUE, TextA: ColumnAt(1), TextB: ColumnAt(2), Label: ColumnAt(-1)})
	if err != nil || len(exs) != 1 || exs[0].Label != "entailment" || exs[0].TextB != "A person." {
		t.Errorf("line[-1]: %+v %v", exs, err)
	}
	if _, err := Open(mnli, ReadOptions{Format: FormatGLUE, TextA: ColumnAt(9)}); err == nil || !strings.Contains(err.Error(), mnli+":1: header has 5 columns, no column 9 for text_a") {
		t.Errorf("index beyond the header: %v", err)
	}
	// MRPC's train.tsv and dev.tsv as GLUE's download script writes them: the header starts with
	// a byte order mark, which run_classifier skips with the header line. Named, the column
	// matches without it.
	mrpc := writeFile(t, "mrpc.tsv", "\ufeffQuality\t#1 ID\t#2 ID\t#1 String\t#2 String\n1\t702876\t702977\tAmrozi accused his brother .\tAmrozi accused him .\n")
	for _, label := range []Column{ColumnAt(0), ColumnNamed("Quality")} {
		exs, _, err = readAll(t, mrpc, ReadOptions{Format: FormatGLUE, TextA: ColumnAt(3), TextB: ColumnAt(4), Label: label})
		if err != nil || len(exs) != 1 || exs[0].Label != "1" || exs[0].TextB != "Amrozi accused him ." {
			t.Errorf("header with a byte order mark, label %s: %+v %v", label, exs, err)
		}
	}
}

// XNLI's dev file as run_classifier's XnliProcessor reads it: one language's lines kept by the
// language column, the others counted as filtered; XNLI's train file's "contradictory" read as
// the label list's "contradiction".
func TestGLUEFilterAndLabelAliases(t *testing.T) {
	path := writeFile(t, "xnli.dev.tsv", "language\tgold_label\tsentence1\tsentence2\n"+
		"en\tneutral\tA.\tB.\nzh\tcontradictory\t他.\t她.\nzh\tentailment\t是.\t对.\nde\tneutral\tJa.\tNein.\n")
	labels, _ := NewLabels([]string{"contradiction", "entailment", "neutral"})
	opts := ReadOptions{Format: FormatGLUE, TextA: ColumnAt(2), TextB: ColumnAt(3), Label: ColumnAt(1), Labels: labels,
		Where: Filter{ColumnNamed("language"), "zh"}, LabelAliases: map[string]string{"contradictory": "contradiction"}}
	exs, counts, err := readAll(t, path, opts)
	want := []InputExample{
		{GUID: path + ":3", TextA: "他.", TextB: "她.", Label: "contradiction"},
		{GUID: path + ":4", TextA: "是.", TextB: "对.", Label: "entailment"},
	}
	if err != nil || !slices.Equal(exs, want) || counts != (Counts{Lines: 4, Read: 2, Filtered: 2}) {
		t.Errorf("got %+v %+v %v", exs, counts, err)
	}
	// Over two ranks every line is read, skipped or filtered by one of them.
	sum := 0
	for rank := range 2 {
		opts.Rank, opts.Size = rank, 2
		_, c, err := readAll(t, path, opts)
		if err != nil {
			t.Fatal(err)
		}
		sum += c.Read + c.Skipped + c.Filtered
	}
	if sum != 4 {
		t.Errorf("read+skipped+filtered over ranks %d, want 4", sum)
	}
	opts.Rank, opts.Size, opts.Where = 0, 1, Filter{ColumnNamed("lang"), "zh"}
	if _, err := Open(path, opts); err == nil || !strings.Contains(err.Error(), `header has no column "lang"`) {
		t.Errorf("filter on a missing column: %v", err)
	}
}

// A seed-format test file may omit the labels: then the whole line is the text, tabs included.
func TestSeedUnlabelled(t *testing.T) {
	path := writeFile(t, "test.tsv", "a review\nwith\ta tab\n")
	exs, _, err := readAll(t, path, ReadOptions{Unlabelled: true})
	want := []InputExample{{GUID: path + ":1", TextA: "a review"}, {GUID: path + ":2", TextA: "with\ta tab"}}
	if err != nil || !slices.Equal(exs, want) {
		t.Errorf("got %+v %v", exs, err)
	}
}

// drainStream reads every batch of s, then closes it.
func drainStream(t *testing.T, s *Stream) []*Batch {
	t.Helper()
	defer s.Close()
	var got []*Batch
	for {
		b, err := s.Next()
		if err == io.EOF {
			return got
		}
		if err != nil {
			t.Fatal(err)
		}
		got = append(got, b)
	}
}

func TestStreamMatchesSequential(t *testing.T) {
	c := newConv(t, 6)
	var exs []InputExample
	for i := range 1003 {
		exs = append(exs, InputExample{GUID: fmt.Sprint(i), TextA: strings.Repeat("a b c ", 3)[:2*(i%5)+1], Label: []string{"neg", "pos"}[i%2]})
	}
	for _, drop := range []bool{false, true} {
		got := drainStream(t, c.Stream(&SliceSource{Examples: exs}, StreamOptions{BatchSize: 10, Workers: 4, DropRemainder: drop}))
		wantBatches := 101
		if drop {
			wantBatches = 100
		}
		if len(got) != wantBatches {
			t.Fatalf("drop=%v: %d batches, want %d", drop, len(got), wantBatches)
		}
		for i, b := range got {
			end := min(len(exs), (i+1)*10)
			want, _ := c.ConvertBatch(exs[i*10:end], end-i*10)
			if !slices.Equal(b.InputIDs, want.InputIDs) || !slices.Equal(b.GUIDs, want.GUIDs) || !slices.Equal(b.IsRealExample, want.IsRealExample) || !slices.Equal(b.LabelIDs, want.LabelIDs) {
				t.Fatalf("batch %d differs from sequential conversion", i)
			}
		}
		// The last batch holds its 3 examples and no padding (its cost follows them).
		if !drop && (got[100].NumReal() != 3 || got[100].BatchSize != 3) {
			t.Errorf("last batch has %d real examples in a batch of %d, want 3 in 3", got[100].NumReal(), got[100].BatchSize)
		}
	}
}

// A batch size far beyond the data (a whole eval set as one batch, whatever its size) costs
// what the examples do: the batch holds them alone, and no buffer of the flag's size is made
// (one of 2^40 examples used to crash the stream's goroutine).
func TestStreamBatchBeyondTheData(t *testing.T) {
	c := newConv(t, 6)
	exs := []InputExample{{GUID: "a", TextA: "a", Label: "neg"}, {GUID: "b", TextA: "b", Label: "pos"}}
	got := drainStream(t, c.Stream(&SliceSource{Examples: exs}, StreamOptions{BatchSize: 1 << 40}))
	if len(got) != 1 || got[0].BatchSize != 2 || got[0].NumReal() != 2 {
		t.Fatalf("%d batches, want one of 2 examples", len(got))
	}
}

type failingSource struct{ n int }

func (f *failingSource) Next() (InputExample, error) {
	f.n++
	if f.n > 25 {
		return InputExample{}, errors.New("disk on fire")
	}
	return InputExample{TextA: "a", Label: "pos"}, nil
}

func TestStreamErrors(t *testing.T) {
	c := newConv(t, 6)
	s := c.Stream(&failingSource{}, StreamOptions{BatchSize: 10, Workers: 3})
	defer s.Close()
	for i := range 2 {
		if _, err := s.Next(); err != nil {
			t.Fatalf("batch %d: %v", i, err)
		}
	}
	// The 5 examples before the error are dropped with it: the error is what matters.
	if _, err := s.Next(); err == nil || err.Error() != "disk on fire" {
		t.Fatalf("third Next: %v, want the source's error", err)
	}
	bad := c.Stream(&SliceSource{Examples: []InputExample{{GUID: "g7", TextA: "a", Label: "nope"}}}, StreamOptions{BatchSize: 4})
	defer bad.Close()
	if _, err := bad.Next(); err == nil || !strings.Contains(err.Error(), "g7") {
		t.Fatalf("conversion error: %v", err)
	}
	// Closing early does not hang.
	early := c.Stream(&SliceSource{Examples: make([]InputExample, 10000)}, StreamOptions{BatchSize: 1, Workers: 2})
	early.Close()
}

// countingSource yields n examples and counts how many it has yielded.
type countingSource struct {
	n, yielded int
	mu         sync.Mutex
}

func (c *countingSource) Next() (InputExample, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.yielded == c.n {
		return InputExample{}, io.EOF
	}
	c.yielded++
	return InputExample{TextA: "a b c d", Label: "pos"}, nil
}

func (c *countingSource) count() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.yielded
}

// A consumer that stops taking batches stops the reading: the stream holds a bounded number of
// batches whatever the input's size, so a file larger than memory streams in constant space.
func TestStreamReadsAheadBoundedly(t *testing.T) {
	c := newConv(t, 6)
	const batch, workers = 10, 3
	src := &countingSource{n: 1 << 30}
	s := c.Stream(src, StreamOptions{BatchSize: batch, Workers: workers})
	defer s.Close()
	for range 5 {
		if _, err := s.Next(); err != nil {
			t.Fatal(err)
		}
	}
	// Let the producer run as far ahead as it can.
	prev := -1
	for range 100 {
		time.Sleep(5 * time.Millisecond)
		n := src.count()
		if n == prev {
			break
		}
		prev = n
	}
	// Taken batches, plus queued futures (2 per worker), plus jobs (1 per worker), plus one
	// batch per worker in conversion, plus the batch being gathered.
	limit := (5 + 2*workers + workers + workers + 1) * batch
	if n := src.count(); n > limit {
		t.Fatalf("the stream read %d examples ahead of a consumer that took 50: more than %d", n, limit)
	}
}

func TestConvertHeadTail(t *testing.T) {
	c := newConv(t, 8)                                               // 6 tokens for the text
	long := InputExample{TextA: "a b c d e f g h a b", Label: "neg"} // ids 5..12 5 6
	cases := []struct {
		tail int
		want []int32
	}{
		{0, []int32{2, 5, 6, 7, 8, 9, 10, 3}},   // BERT: the head alone
		{2, []int32{2, 5, 6, 7, 8, 5, 6, 3}},    // first 4, last 2
		{5, []int32{2, 5, 10, 11, 12, 5, 6, 3}}, // first 1, last 5
		{6, []int32{2, 9, 10, 11, 12, 5, 6, 3}}, // the tail alone
	}
	for _, tc := range cases {
		ht, err := c.WithTailTokens(tc.tail)
		if err != nil {
			t.Fatal(err)
		}
		if ht.TailTokens() != tc.tail || c.TailTokens() != 0 {
			t.Fatalf("TailTokens %d (original %d), want %d (0)", ht.TailTokens(), c.TailTokens(), tc.tail)
		}
		f, err := ht.Convert(long)
		if err != nil {
			t.Fatal(err)
		}
		if !slices.Equal(f.InputIDs, tc.want) {
			t.Errorf("tail %d: ids %v, want %v", tc.tail, f.InputIDs, tc.want)
		}
		// A text that fits is whole, whatever the tail.
		f, _ = ht.Convert(InputExample{TextA: "a b c d e f", Label: "pos"})
		if want := []int32{2, 5, 6, 7, 8, 9, 10, 3}; !slices.Equal(f.InputIDs, want) {
			t.Errorf("tail %d, a text that fits: ids %v, want %v", tc.tail, f.InputIDs, want)
		}
		// Pairs stay longest-first, as run_classifier.
		f, _ = ht.Convert(InputExample{TextA: "a b c d e f", TextB: "g h", Label: "pos"})
		if want := []int32{2, 5, 6, 7, 3, 11, 12, 3}; !slices.Equal(f.InputIDs, want) {
			t.Errorf("tail %d, a pair: ids %v, want %v", tc.tail, f.InputIDs, want)
		}
	}
	// Batches convert through a reused scratch buffer: a truncated text must not leak into the next.
	ht, _ := c.WithTailTokens(2)
	b, err := ht.ConvertBatch([]InputExample{long, {TextA: "c d", Label: "pos"}, long}, 3)
	if err != nil {
		t.Fatal(err)
	}
	want := []int32{2, 5, 6, 7, 8, 5, 6, 3, 2, 7, 8, 3, 0, 0, 0, 0, 2, 5, 6, 7, 8, 5, 6, 3}
	if !slices.Equal(b.InputIDs, want) {
		t.Errorf("batch ids %v, want %v", b.InputIDs, want)
	}
	for _, n := range []int{-1, 7} {
		if _, err := c.WithTailTokens(n); err == nil || !strings.Contains(err.Error(), "max_seq_length-2 = 6") {
			t.Errorf("WithTailTokens(%d): %v, want an error naming the range", n, err)
		}
	}
}
