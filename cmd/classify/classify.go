package main

import (
	"bufio"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"unicode/utf8"

	"github.com/gorovod/gorovod/bertgraph"
	"github.com/gorovod/gorovod/bertgraph/features"
	"github.com/gorovod/gorovod/tf"
)

// config is the command line.
type config struct {
	model     string
	batchSize int
	threads   int
	header    bool
	strict    bool
	inputs    []string
}

// run is the command: it returns the exit status (0 success, 1 failure, 2 bad usage).
func run(args []string, stdin io.Reader, stdout, stderr io.Writer) int {
	cfg, err := parseFlags(args, stderr)
	if errors.Is(err, flag.ErrHelp) {
		return 0
	}
	if err != nil {
		fmt.Fprintf(stderr, "classify: %v\n", err)
		return 2
	}
	if err := classify(cfg, stdin, stdout, stderr); err != nil {
		fmt.Fprintf(stderr, "classify: %v\n", err)
		return 1
	}
	return 0
}

func parseFlags(args []string, stderr io.Writer) (*config, error) {
	cfg := &config{}
	fs := flag.NewFlagSet("classify", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.Usage = func() {
		fmt.Fprintln(fs.Output(), "usage: classify --model DIR [flags] [FILE|-]...\n\nClassifies one text per input line with a serving SavedModel exported by finetune and writes\nlabel<TAB>prob_1<TAB>...<TAB>prob_n per line, in input order.\n\nflags:")
		fs.PrintDefaults()
	}
	fs.StringVar(&cfg.model, "model", "", "serving SavedModel `dir` (output_dir/export/<step>), or export/ itself to serve its highest numeric step (required)")
	// Passed down as the Classifier's MaxBatchSize, so that one batch is one session run.
	fs.IntVar(&cfg.batchSize, "batch_size", bertgraph.DefaultClassifierBatchSize, "texts per session run")
	fs.IntVar(&cfg.threads, "threads", 0, "TensorFlow intra-op threads (0: TensorFlow's default, one per core)")
	fs.BoolVar(&cfg.header, "header", false, "write a header row label<TAB>prob_<name>... before the first result")
	fs.BoolVar(&cfg.strict, "strict", false, "fail on an input line that is not valid UTF-8 (default: warn, naming the line, and classify it without the invalid bytes)")
	if err := fs.Parse(args); err != nil {
		return nil, err
	}
	switch {
	case cfg.model == "":
		return nil, errors.New("--model is required (a serving export: output_dir/export/<step>, or output_dir/export)")
	case cfg.batchSize < 1 || cfg.batchSize > maxBatchSize:
		return nil, fmt.Errorf("--batch_size %d: must be 1 to %d", cfg.batchSize, maxBatchSize)
	case cfg.threads < 0 || cfg.threads > 1<<20:
		return nil, fmt.Errorf("--threads %d: must be 0 (TensorFlow's default) or a positive count", cfg.threads)
	}
	cfg.inputs = fs.Args()
	if len(cfg.inputs) == 0 {
		cfg.inputs = []string{"-"}
	}
	return cfg, nil
}

// maxBatchSize bounds --batch_size: far beyond what one session run can hold, short of sizes
// whose batch buffer alone would not fit in memory.
const maxBatchSize = 1 << 20

// classify opens every input first (a missing file fails before the model loads and before any
// output), then streams the lines through the classifier one batch at a time. A line that is not
// valid UTF-8 is named on stderr (the tokenizer drops the invalid bytes, as BERT's does), or
// fails the run with --strict. On any failure the output holds every row classified before it,
// whole: it ends at a row's end, never inside one.
func classify(cfg *config, stdin io.Reader, stdout, stderr io.Writer) (err error) {
	inputs := make([]input, 0, len(cfg.inputs))
	defer func() {
		for _, in := range inputs {
			if in.close != nil {
				err = errors.Join(err, in.close())
			}
		}
	}()
	for _, name := range cfg.inputs {
		if name == "-" {
			inputs = append(inputs, input{name: "standard input", r: stdin})
			continue
		}
		f, err := os.Open(name)
		if err != nil {
			return fmt.Errorf("input: %w", err)
		}
		inputs = append(inputs, input{name: name, r: f, close: f.Close})
	}

	dir, err := resolveModel(cfg.model)
	if err != nil {
		return err
	}
	// Before the model loads: each batch then reuses the last one's memory instead of faulting
	// it in again (tf.ReuseFreedMemory). Without it classifying is only slower.
	if err := tf.ReuseFreedMemory(); err != nil {
		fmt.Fprintf(stderr, "classify: warning: %v: each batch faults its memory in again\n", err)
	}
	opts := bertgraph.ClassifierOptions{MaxBatchSize: cfg.batchSize}
	if cfg.threads > 0 {
		opts.Session = &tf.SessionOptions{IntraOpThreads: int32(cfg.threads)}
	}
	cl, err := bertgraph.LoadClassifier(dir, opts)
	if err != nil {
		return fmt.Errorf("--model %s: %w", cfg.model, err)
	}
	defer func() { err = errors.Join(err, cl.Close()) }()

	w := &writer{out: bufio.NewWriter(stdout), labels: cl.Labels(), header: cfg.header}
	defer func() {
		if err != nil { // the rows buffered so far are whole: the output ends at a row's end
			w.out.Flush()
		}
	}()
	batch := make([]string, 0, min(cfg.batchSize, 1024))
	var where []position // input position of each text in batch, for error messages
	flush := func() error {
		if len(batch) == 0 {
			return nil
		}
		preds, err := cl.Predict(batch)
		if err != nil {
			return fmt.Errorf("classifying %s to %s: %w", where[0], where[len(where)-1], err)
		}
		if err := w.rows(preds); err != nil {
			return err
		}
		batch, where = batch[:0], where[:0]
		return nil
	}
	invalid := 0 // lines that are not valid UTF-8
	for _, in := range inputs {
		r := bufio.NewReader(in.r)
		for line := 1; ; line++ {
			text, err := r.ReadString('\n')
			if err != nil && err != io.EOF {
				return fmt.Errorf("reading %s (line %d): %w", in.name, line, err)
			}
			if err == io.EOF && text == "" {
				break
			}
			text = strings.TrimSuffix(strings.TrimSuffix(text, "\n"), "\r")
			if !utf8.ValidString(text) {
				at := position{in.name, line}
				reason := fmt.Sprintf("invalid UTF-8 at byte %d of the line", features.ValidUTF8Prefix([]byte(text)))
				if cfg.strict {
					return fmt.Errorf("%s: %s (--strict)", at, reason)
				}
				if invalid++; invalid <= maxInvalidWarnings {
					fmt.Fprintf(stderr, "classify: warning: %s: %s; classified without the invalid bytes (--strict fails instead)\n", at, reason)
				}
			}
			batch = append(batch, text)
			where = append(where, position{in.name, line})
			if len(batch) == cfg.batchSize {
				if err := flush(); err != nil {
					return err
				}
			}
			if err == io.EOF {
				break
			}
		}
	}
	if err := flush(); err != nil {
		return err
	}
	if invalid > maxInvalidWarnings {
		fmt.Fprintf(stderr, "classify: warning: %d lines in all were not valid UTF-8 (the first %d named above)\n", invalid, maxInvalidWarnings)
	}
	if err := w.out.Flush(); err != nil {
		return fmt.Errorf("writing the results: %w", err)
	}
	return nil
}

// maxInvalidWarnings bounds the lines named for invalid UTF-8; the rest are counted.
const maxInvalidWarnings = 10

type input struct {
	name  string
	r     io.Reader
	close func() error
}

type position struct {
	file string
	line int
}

func (p position) String() string { return fmt.Sprintf("%s:%d", p.file, p.line) }

// writer formats predictions as TSV rows; the header goes out with the first row.
type writer struct {
	out    *bufio.Writer
	labels []string
	header bool
}

func (w *writer) rows(preds []bertgraph.Prediction) error {
	if w.header {
		w.out.WriteString("label")
		for _, name := range w.labels {
			w.out.WriteString("\tprob_" + name)
		}
		w.out.WriteByte('\n')
		w.header = false
	}
	var b []byte
	for _, p := range preds {
		b = append(b[:0], p.Label...)
		for _, v := range p.Probabilities {
			b = append(b, '\t')
			b = strconv.AppendFloat(b, float64(v), 'g', -1, 32)
		}
		b = append(b, '\n')
		if _, err := w.out.Write(b); err != nil {
			return fmt.Errorf("writing the results: %w", err)
		}
	}
	return nil
}

// resolveModel returns dir if it is a SavedModel, else the highest numeric version below it
// that holds one (TensorFlow Serving's layout: export/<version>/saved_model.pb; other names are
// ignored, and so are numbered directories without a saved_model.pb: finetune's output_dir/<rank>
// holds that rank's features, its export is output_dir/export).
func resolveModel(dir string) (string, error) {
	info, err := os.Stat(dir)
	if err != nil {
		return "", fmt.Errorf("--model: %w", err)
	}
	if !info.IsDir() {
		return "", fmt.Errorf("--model %s: not a directory", dir)
	}
	if _, err := os.Stat(filepath.Join(dir, "saved_model.pb")); err == nil {
		return dir, nil
	}
	entries, err := os.ReadDir(dir)
	if err != nil {
		return "", fmt.Errorf("--model: %w", err)
	}
	best, bestVersion := "", int64(-1)
	for _, e := range entries {
		v, err := strconv.ParseInt(e.Name(), 10, 64)
		if err != nil || v < 0 || !e.IsDir() {
			continue
		}
		if _, err := os.Stat(filepath.Join(dir, e.Name(), "saved_model.pb")); err != nil {
			continue
		}
		if v > bestVersion {
			best, bestVersion = e.Name(), v
		}
	}
	if best == "" {
		hint := ""
		if _, err := os.Stat(filepath.Join(dir, "export")); err == nil {
			hint = fmt.Sprintf("; %s holds finetune's export", filepath.Join(dir, "export"))
		}
		return "", fmt.Errorf("--model %s: neither a SavedModel (no saved_model.pb) nor an export directory of numbered versions holding one (finetune writes output_dir/export/<step>)%s", dir, hint)
	}
	return filepath.Join(dir, best), nil
}
