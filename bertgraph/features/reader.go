package features

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
	"slices"
	"strings"
	"unicode/utf8"
)

// Format is the layout of a text data file.
type Format int

const (
	// FormatSeed is one example a line, `label<TAB>text`, no header (the format of the Horovod
	// BERT recipe's train_bert.txt and of `make data`'s IMDB files). The text is everything after
	// the first tab.
	FormatSeed Format = iota
	// FormatGLUE is tab-separated values, by default with a header line naming the columns;
	// ReadOptions say which columns hold the texts and the label. No quoting: a quote is a
	// character like any other, as run_classifier's _read_tsv (csv with quotechar=None).
	FormatGLUE
)

// Column picks a field of a FormatGLUE line: by header name, or by 0-based index as
// run_classifier's processors do (line[3]); a negative index counts from the end (line[-1]).
// The zero Column is no column.
type Column struct {
	name  string
	index int
	set   bool
}

// ColumnNamed is the field under header name.
func ColumnNamed(name string) Column { return Column{name: name, set: true} }

// ColumnAt is the field at index; -1 is the last.
func ColumnAt(index int) Column { return Column{index: index, set: true} }

// String is how errors name the column.
func (c Column) String() string {
	if c.name != "" {
		return fmt.Sprintf("%q", c.name)
	}
	return fmt.Sprintf("%d", c.index)
}

// ReadOptions configure a Reader.
type ReadOptions struct {
	Format Format
	// Columns of FormatGLUE. TextA defaults to the column named "sentence"; Label to the one
	// named "label" unless Unlabelled is set. A zero TextB means single-sequence examples.
	TextA, TextB, Label Column
	// Unlabelled reads FormatGLUE without a label column, and FormatSeed lines as the text
	// alone, without `label<TAB>` (a test file without labels).
	Unlabelled bool
	// NoHeader reads FormatGLUE without a header line (CoLA's train.tsv and dev.tsv): every line
	// is data and the columns must be by index. With a header, every line must have its number
	// of fields; without, enough fields for the columns.
	NoHeader bool
	// Where, when its Column is set, keeps only the FormatGLUE lines whose field in that column
	// equals Value (XNLI's dev file holds every language, run_classifier keeps one); the others
	// are counted as Filtered.
	Where Filter
	// LabelAliases renames labels as read before the label list sees them (XNLI's training file
	// says "contradictory" where the label list has "contradiction").
	LabelAliases map[string]string
	// Rank and Size shard the file: data line i (0-based, the header not counted) belongs to rank
	// i % Size, as in the Horovod BERT recipe. Size 0 means 1.
	Rank, Size int
	// Labels, when set, makes a label outside the list bad input.
	Labels *Labels
	// SkipBad skips bad lines and counts them instead of failing on the first one.
	SkipBad bool
	// MaxLines, when positive, ends the file after its first MaxLines data lines (every rank's
	// counted, the header not): the ranks together read exactly those lines, and nothing after
	// them is read, checked or counted.
	MaxLines int
}

// Filter selects lines by the value of one field.
type Filter struct {
	Column Column
	Value  string
}

// LineError is bad input: the file, the 1-based line number and what is wrong.
type LineError struct {
	Path   string
	Line   int
	Reason string
}

func (e *LineError) Error() string { return fmt.Sprintf("%s:%d: %s", e.Path, e.Line, e.Reason) }

// Counts are what a Reader has seen so far. Over all ranks, the Read, Skipped and Filtered
// counts add up to Lines: every data line is read, skipped or filtered out by exactly one rank.
type Counts struct {
	// Lines: data lines of the whole file seen so far (every rank's), header excluded.
	Lines int
	// Read: examples this rank returned.
	Read int
	// Skipped: bad lines of this rank's share skipped under SkipBad.
	Skipped int
	// Filtered: lines of this rank's share that ReadOptions.Where left out.
	Filtered int
}

// Reader streams the examples of one rank's share of a text data file. Every rank checks every
// line, so bad input fails all ranks alike and at the same line rather than one rank alone.
type Reader struct {
	path   string
	f      *os.File
	br     *bufio.Reader
	opts   ReadOptions
	line   int // 1-based number of the last line read
	counts Counts
	// FormatGLUE: the header's number of fields (0 without header) and the columns, by index
	// once the header resolved the names.
	nCols                         int
	colA, colB, colLabel, colKeep Column
}

// ShardSize checks that rank is one of size processes' shards and returns size, 0 meaning 1
// (a single process). The readers of every input format (this package's, tfrecord's) use it.
func ShardSize(rank, size int) (int, error) {
	if size == 0 {
		size = 1
	}
	if size < 0 || rank < 0 || rank >= size {
		return 0, fmt.Errorf("rank %d of size %d is not a valid shard", rank, size)
	}
	return size, nil
}

// Open opens path for reading one rank's examples. A GLUE file's header is read and checked here.
func Open(path string, opts ReadOptions) (*Reader, error) {
	var err error
	if opts.Size, err = ShardSize(opts.Rank, opts.Size); err != nil {
		return nil, fmt.Errorf("features: %w", err)
	}
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("features: %w", err)
	}
	r := &Reader{path: path, f: f, br: bufio.NewReaderSize(f, 1<<16), opts: opts}
	if opts.Format == FormatGLUE {
		if err := r.columns(); err != nil {
			f.Close()
			return nil, err
		}
	}
	return r, nil
}

// Close closes the file.
func (r *Reader) Close() error { return r.f.Close() }

// Counts returns the counts so far; after io.EOF they are final.
func (r *Reader) Counts() Counts { return r.counts }

// Path is the file read.
func (r *Reader) Path() string { return r.path }

// Next returns this rank's next example, io.EOF after the last, or a *LineError for a bad line
// (unless SkipBad). Read errors are returned as they are.
func (r *Reader) Next() (InputExample, error) {
	for {
		if r.opts.MaxLines > 0 && r.counts.Lines >= r.opts.MaxLines {
			return InputExample{}, io.EOF
		}
		raw, err := r.readLine()
		if err != nil {
			return InputExample{}, err
		}
		mine := r.counts.Lines%r.opts.Size == r.opts.Rank
		r.counts.Lines++
		ex, reason, kept := r.parse(raw, mine)
		if !kept {
			if mine {
				r.counts.Filtered++
			}
			continue
		}
		if reason != "" {
			if !r.opts.SkipBad {
				return InputExample{}, &LineError{Path: r.path, Line: r.line, Reason: reason}
			}
			if mine {
				r.counts.Skipped++
			}
			continue
		}
		if mine {
			r.counts.Read++
			return ex, nil
		}
	}
}

// readLine returns the next line without its LF; io.EOF at the end. A final line without LF
// counts as a line; a file ending in LF has no empty line after it.
func (r *Reader) readLine() ([]byte, error) {
	raw, err := r.br.ReadSlice('\n')
	if err == bufio.ErrBufferFull {
		// A line longer than the buffer: gather it.
		long := append([]byte(nil), raw...)
		for err == bufio.ErrBufferFull {
			raw, err = r.br.ReadSlice('\n')
			long = append(long, raw...)
		}
		raw = long
	}
	if err != nil && err != io.EOF {
		return nil, fmt.Errorf("features: %s: line %d: %w", r.path, r.line+1, err)
	}
	if len(raw) == 0 && err == io.EOF {
		return nil, io.EOF
	}
	r.line++
	return bytes.TrimSuffix(raw, []byte{'\n'}), nil
}

// lineReason is what is wrong with a line as a whole, or "".
func lineReason(raw []byte, lineNo int) string {
	switch {
	case lineNo == 1 && bytes.HasPrefix(raw, []byte("\ufeff")):
		return "starts with a UTF-8 byte order mark (U+FEFF); save the file without BOM"
	case bytes.HasSuffix(raw, []byte{'\r'}):
		return "ends with CR: CRLF line endings; convert the file to LF endings"
	case bytes.IndexByte(raw, '\r') >= 0:
		// Lines end at LF only (as TensorFlow's GFile reads them for run_classifier.py, whose
		// csv.reader then refuses a CR in a field): a file with CR line endings would be one
		// line, its examples folded into one text.
		return fmt.Sprintf("holds a CR (carriage return) at byte %d: CR line endings, or a CR in the text; convert the file to LF endings", bytes.IndexByte(raw, '\r'))
	case len(bytes.TrimSpace(raw)) == 0:
		return "blank line"
	case !utf8.Valid(raw):
		return fmt.Sprintf("invalid UTF-8 at byte %d of the line", ValidUTF8Prefix(raw))
	}
	return ""
}

// ValidUTF8Prefix is the length of the longest valid UTF-8 prefix of b: where its first invalid
// byte is, for a message that names it.
func ValidUTF8Prefix(b []byte) int {
	n := 0
	for n < len(b) {
		r, size := utf8.DecodeRune(b[n:])
		if r == utf8.RuneError && size == 1 {
			break
		}
		n += size
	}
	return n
}

// parse checks a data line and returns why it is bad, or "" and, when build is set (the line is
// this rank's), its example; other ranks' lines are checked without copying their text. kept is
// false for a line that ReadOptions.Where leaves out.
func (r *Reader) parse(raw []byte, build bool) (ex InputExample, reason string, kept bool) {
	if reason = lineReason(raw, r.line); reason != "" {
		return InputExample{}, reason, true
	}
	var label, textA, textB []byte
	switch {
	case r.opts.Format == FormatSeed && r.opts.Unlabelled:
		textA = raw
	case r.opts.Format == FormatSeed:
		var ok bool
		if label, textA, ok = bytes.Cut(raw, []byte{'\t'}); !ok {
			return InputExample{}, "no tab: expected `label<TAB>text`", true
		}
		if len(label) == 0 {
			return InputExample{}, "empty label", true
		}
	default:
		fields := bytes.Split(raw, []byte{'\t'})
		if r.nCols > 0 && len(fields) != r.nCols {
			return InputExample{}, fmt.Sprintf("%d tab-separated fields, the header has %d", len(fields), r.nCols), true
		}
		if r.colKeep.set {
			var v []byte
			if v, reason = field(fields, r.colKeep, "the filter"); reason != "" {
				return InputExample{}, reason, true
			}
			if string(v) != r.opts.Where.Value {
				return InputExample{}, "", false
			}
		}
		if textA, reason = field(fields, r.colA, "text_a"); reason != "" {
			return InputExample{}, reason, true
		}
		// An empty text_b is kept: run_classifier makes it a single-sequence example.
		if r.colB.set {
			if textB, reason = field(fields, r.colB, "text_b"); reason != "" {
				return InputExample{}, reason, true
			}
		}
		if r.colLabel.set {
			if label, reason = field(fields, r.colLabel, "label"); reason != "" {
				return InputExample{}, reason, true
			}
			if len(label) == 0 {
				return InputExample{}, "empty label", true
			}
		}
	}
	if alias, ok := r.opts.LabelAliases[string(label)]; ok && len(label) > 0 {
		label = []byte(alias)
	}
	if len(bytes.TrimSpace(textA)) == 0 {
		return InputExample{}, "empty text", true
	}
	if r.opts.Labels != nil && len(label) > 0 {
		if _, ok := r.opts.Labels.ID(string(label)); !ok {
			return InputExample{}, fmt.Sprintf("label %q is not in the label list %q", label, r.opts.Labels.names), true
		}
	}
	if !build {
		return InputExample{}, "", true
	}
	return InputExample{
		GUID:  fmt.Sprintf("%s:%d", r.path, r.line),
		TextA: string(textA), TextB: string(textB), Label: string(label),
	}, "", true
}

// field returns the field of col, or why the line has none.
func field(fields [][]byte, col Column, what string) ([]byte, string) {
	i := col.index
	if i < 0 {
		i += len(fields)
	}
	if i < 0 || i >= len(fields) {
		return nil, fmt.Sprintf("%d tab-separated fields, no column %d for %s", len(fields), col.index, what)
	}
	return fields[i], ""
}

// columns settles the GLUE columns: the defaults, and names resolved to indexes through the
// header line, which it reads unless NoHeader.
func (r *Reader) columns() error {
	o := &r.opts
	if !o.TextA.set {
		o.TextA = ColumnNamed("sentence")
	}
	if !o.Label.set && !o.Unlabelled {
		o.Label = ColumnNamed("label")
	}
	if o.Unlabelled {
		o.Label = Column{}
	}
	r.colA, r.colB, r.colLabel, r.colKeep = o.TextA, o.TextB, o.Label, o.Where.Column
	if o.NoHeader {
		for _, c := range []Column{r.colA, r.colB, r.colLabel, r.colKeep} {
			if c.name != "" {
				return fmt.Errorf("features: %s: column %s by name, but the file is read without a header", r.path, c)
			}
		}
		return nil
	}
	raw, err := r.readLine()
	if err == io.EOF {
		return fmt.Errorf("features: %s: empty file: expected a header line", r.path)
	}
	if err != nil {
		return err
	}
	// A byte order mark before a header is dropped: GLUE's download script copies the first line
	// of Microsoft's MRPC files, BOM and all, into MRPC's train.tsv and dev.tsv. A header is
	// never data, and its column names then match without the mark. On a data line the rule
	// stays (lineReason): there the mark would be part of a text or a label.
	raw = bytes.TrimPrefix(raw, []byte("\ufeff"))
	if reason := lineReason(raw, 1); reason != "" {
		return &LineError{Path: r.path, Line: 1, Reason: "header " + reason}
	}
	cols := strings.Split(string(raw), "\t")
	r.nCols = len(cols)
	resolve := func(c *Column, what string) error {
		if !c.set {
			return nil
		}
		if c.name == "" {
			if i := c.index; i >= len(cols) || i < -len(cols) {
				return &LineError{Path: r.path, Line: 1, Reason: fmt.Sprintf("header has %d columns, no column %d for %s", len(cols), i, what)}
			}
			return nil
		}
		i := slices.Index(cols, c.name)
		if i < 0 {
			return &LineError{Path: r.path, Line: 1, Reason: fmt.Sprintf("header has no column %q (columns: %q)", c.name, cols)}
		}
		*c = ColumnAt(i)
		return nil
	}
	return errors.Join(resolve(&r.colA, "text_a"), resolve(&r.colB, "text_b"), resolve(&r.colLabel, "label"), resolve(&r.colKeep, "the filter"))
}
