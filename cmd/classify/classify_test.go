package main

import (
	"bytes"
	"fmt"
	"math"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/gorovod/gorovod/bertgraph"

	"github.com/gorovod/gorovod/tf/testenv"
)

// The fixture: a tiny training model from the Python exporter (3 labels, random weights, so
// every text gets its own probabilities) and finetune's export layout below it, exported with
// bertgraph's ExportServing as finetune does: export/2 names the labels a,b,c and export/10
// neg,mid,pos, so the label column tells which version served (10 is the highest number but not
// the last name in lexical order); export/tmp is not a version and export/99, holding no
// saved_model.pb, is none either: both are ignored.
var fixture struct {
	training string // the training SavedModel
	exports  string // .../export
	latest   string // .../export/10
}

var fixtureLabels = map[string][]string{"2": {"a", "b", "c"}, "10": {"neg", "mid", "pos"}}

func TestMain(m *testing.M) {
	testenv.VenvPython.RequireMain()
	dir, err := os.MkdirTemp("", "classify-test-")
	if err == nil {
		err = writeFixture(dir)
	}
	if err != nil {
		fmt.Fprintf(os.Stderr, "classify tests: %v\n", err)
		os.RemoveAll(dir)
		os.Exit(1)
	}
	code := m.Run()
	os.RemoveAll(dir)
	os.Exit(code)
}

func writeFixture(dir string) error {
	fixture.training = filepath.Join(dir, "training")
	cmd := exec.Command(testenv.VenvPython.Path(), "-m", "bertgraph.exporter.export", "--tiny",
		"--num_labels", "3", "--max_seq_length", "16", "--seed", "11", "--out", fixture.training)
	cmd.Dir = testenv.Root()
	cmd.Env = append(os.Environ(), "TF_CPP_MIN_LOG_LEVEL=2", "CUDA_VISIBLE_DEVICES=")
	if out, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("the Python exporter could not write the tiny model (run `make setup`): %v\n%s", err, out)
	}
	m, err := bertgraph.Load(fixture.training, bertgraph.Options{})
	if err != nil {
		return err
	}
	defer m.Close()
	fixture.exports = filepath.Join(dir, "output", "export")
	for step, labels := range fixtureLabels {
		if err := m.ExportServing(filepath.Join(fixture.exports, step), bertgraph.ExportOptions{LabelNames: labels}); err != nil {
			return err
		}
	}
	fixture.latest = filepath.Join(fixture.exports, "10")
	if err := os.Mkdir(filepath.Join(fixture.exports, "tmp"), 0o755); err != nil {
		return err
	}
	return os.Mkdir(filepath.Join(fixture.exports, "99"), 0o755)
}

// classifyCmd runs the command in-process with stdin and returns its exit status, stdout and
// stderr.
func classifyCmd(t *testing.T, stdin string, args ...string) (int, string, string) {
	t.Helper()
	var stdout, stderr bytes.Buffer
	code := run(args, strings.NewReader(stdin), &stdout, &stderr)
	return code, stdout.String(), stderr.String()
}

// texts are n distinct texts of the tiny vocabulary (w0..w122), of 1 to 23 words (longer than
// max_seq_length 16 gets truncated), with an empty one in the middle.
func texts(n int) []string {
	out := make([]string, n)
	for i := range out {
		var words []string
		for j := range 1 + (i*7)%23 {
			words = append(words, "w"+strconv.Itoa((i*13+j*5)%123))
		}
		out[i] = strings.Join(words, " ")
	}
	out[n/2] = ""
	return out
}

// reference is Classifier.Predict on texts in one call, from a classifier of its own.
func reference(t *testing.T, dir string, texts []string) []bertgraph.Prediction {
	t.Helper()
	cl, err := bertgraph.LoadClassifier(dir, bertgraph.ClassifierOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	preds, err := cl.Predict(texts)
	if err != nil {
		t.Fatal(err)
	}
	return preds
}

// checkRows compares the TSV rows with the predictions: label, and probabilities to 1e-6.
func checkRows(t *testing.T, out string, want []bertgraph.Prediction) {
	t.Helper()
	rows := strings.Split(strings.TrimSuffix(out, "\n"), "\n")
	if out == "" || !strings.HasSuffix(out, "\n") || len(rows) != len(want) {
		t.Fatalf("got %d rows, want %d:\n%s", len(rows), len(want), out)
	}
	for i, row := range rows {
		cols := strings.Split(row, "\t")
		if len(cols) != 1+len(want[i].Probabilities) || cols[0] != want[i].Label {
			t.Fatalf("row %d = %q, want label %q and %d probabilities", i, row, want[i].Label, len(want[i].Probabilities))
		}
		for j, c := range cols[1:] {
			p, err := strconv.ParseFloat(c, 32)
			if err != nil {
				t.Fatalf("row %d column %d: %v", i, j+2, err)
			}
			if d := math.Abs(p - float64(want[i].Probabilities[j])); d > 1e-6 {
				t.Errorf("row %d prob %d = %v, Predict gives %v", i, j, p, want[i].Probabilities[j])
			}
		}
	}
}

// The output is Classifier.Predict's on the same texts, in input order, across several batches
// of which the last is partial, over several inputs (files and standard input).
func TestOutputIsPredictInInputOrder(t *testing.T) {
	all := texts(11)
	want := reference(t, fixture.latest, all)
	distinct := map[string]bool{}
	for _, p := range want {
		distinct[fmt.Sprint(p.Probabilities)] = true
	}
	if len(distinct) < 10 {
		t.Fatalf("the model gives only %d distinct predictions for 11 texts: order would go unseen", len(distinct))
	}

	dir := t.TempDir()
	first, second := filepath.Join(dir, "first.txt"), filepath.Join(dir, "second.txt")
	// first.txt ends with CRLF lines and a final newline, standard input has none after its
	// last line.
	if err := os.WriteFile(first, []byte(strings.Join(all[:4], "\r\n")+"\r\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(second, []byte(strings.Join(all[8:], "\n")+"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	stdin := strings.Join(all[4:8], "\n")
	for _, batch := range []string{"4", "1", "32"} {
		t.Run("batch_size="+batch, func(t *testing.T) {
			code, out, stderr := classifyCmd(t, stdin, "--model", fixture.latest, "--batch_size", batch, "--threads", "1", first, "-", second)
			if code != 0 {
				t.Fatalf("exit %d: %s", code, stderr)
			}
			checkRows(t, out, want)
		})
	}
}

// --model export/ serves the highest numeric version; --header names the columns after its
// labels.
func TestExportParentServesTheHighestStep(t *testing.T) {
	in := texts(3)
	code, out, stderr := classifyCmd(t, strings.Join(in, "\n")+"\n", "--model", fixture.exports, "--header")
	if code != 0 {
		t.Fatalf("exit %d: %s", code, stderr)
	}
	header, rows, _ := strings.Cut(out, "\n")
	if header != "label\tprob_neg\tprob_mid\tprob_pos" {
		t.Errorf("header %q: not export/10's labels", header)
	}
	checkRows(t, rows, reference(t, fixture.latest, in))

	// Without --header the first row is a result.
	_, out, _ = classifyCmd(t, in[0], "--model", fixture.exports)
	checkRows(t, out, reference(t, fixture.latest, in[:1]))
}

func TestEmptyInputWritesNothing(t *testing.T) {
	empty := filepath.Join(t.TempDir(), "empty.txt")
	if err := os.WriteFile(empty, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	for _, args := range [][]string{{}, {empty}, {empty, "-"}} {
		code, out, stderr := classifyCmd(t, "", append([]string{"--model", fixture.exports, "--header"}, args...)...)
		if code != 0 || out != "" || stderr != "" {
			t.Errorf("classify %v on empty input: exit %d, stdout %q, stderr %q", args, code, out, stderr)
		}
	}
}

// A line that is not valid UTF-8 is classified (without its invalid bytes, as the tokenizer
// drops them) with a warning naming the file and line; with --strict it fails the run, naming
// them, before any result is written.
func TestInvalidUTF8LinesAreNamed(t *testing.T) {
	in := "w1 w2\nw3 \xff w4\nw5\n"
	code, out, stderr := classifyCmd(t, in, "--model", fixture.latest)
	if code != 0 || !strings.Contains(stderr, "classify: warning: standard input:2: invalid UTF-8 at byte 3 of the line") {
		t.Errorf("exit %d, stderr %q: want 0 and a warning naming line 2", code, stderr)
	}
	checkRows(t, out, reference(t, fixture.latest, []string{"w1 w2", "w3 \xff w4", "w5"}))

	code, out, stderr = classifyCmd(t, in, "--model", fixture.latest, "--strict")
	if code != 1 || out != "" || !strings.Contains(stderr, "classify: standard input:2: invalid UTF-8 at byte 3 of the line (--strict)") {
		t.Errorf("--strict: exit %d, stdout %q, stderr %q: want 1, no result and an error naming line 2", code, out, stderr)
	}
	// A bad line after some batches: the output is the rows classified before it, whole.
	code, out, stderr = classifyCmd(t, "w1 w2\nw3\nw4 \xff\nw5\n", "--model", fixture.latest, "--strict", "--batch_size", "1")
	if code != 1 || !strings.Contains(stderr, "standard input:3: invalid UTF-8") {
		t.Fatalf("--strict, bad line 3, batches of 1: exit %d, stderr %q", code, stderr)
	}
	checkRows(t, out, reference(t, fixture.latest, []string{"w1 w2", "w3"}))
}

// Each bad input fails with a message that names what is wrong, and writes no result.
func TestBadInputsAreNamed(t *testing.T) {
	dir := t.TempDir()
	missing := filepath.Join(dir, "missing.txt")
	notModel := filepath.Join(dir, "not-a-model")
	if err := os.MkdirAll(filepath.Join(notModel, "draft"), 0o755); err != nil {
		t.Fatal(err)
	}
	// finetune's output_dir of a 3-rank run: ranks 1 and 2's features in numbered directories.
	outputDir := filepath.Join(dir, "output")
	for _, sub := range []string{"1", "2", "export"} {
		if err := os.MkdirAll(filepath.Join(outputDir, sub), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	file := filepath.Join(dir, "file.txt")
	if err := os.WriteFile(file, []byte("w1\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		name string
		args []string
		code int
		want []string
	}{
		{"no --model", []string{file}, 2, []string{"--model is required"}},
		{"missing model", []string{"--model", filepath.Join(dir, "nope"), file}, 1, []string{filepath.Join(dir, "nope"), "no such file"}},
		{"model is a file", []string{"--model", file}, 1, []string{file, "not a directory"}},
		{"no SavedModel, no versions", []string{"--model", notModel, file}, 1, []string{notModel, "saved_model.pb", "numbered versions"}},
		{"finetune's output_dir", []string{"--model", outputDir, file}, 1, []string{"numbered versions", filepath.Join(outputDir, "export") + " holds finetune's export"}},
		{"training SavedModel", []string{"--model", fixture.training, file}, 1, []string{fixture.training, "training", "ExportServing"}},
		{"missing input", []string{"--model", fixture.latest, file, missing}, 1, []string{missing, "no such file"}},
		{"input is a directory", []string{"--model", fixture.latest, file, dir}, 1, []string{"reading " + dir + " (line 1)"}},
		{"batch size 0", []string{"--model", fixture.latest, "--batch_size", "0"}, 2, []string{"--batch_size 0"}},
		{"batch size past any memory", []string{"--model", fixture.latest, "--batch_size", "100000000000000"}, 2, []string{"--batch_size 100000000000000: must be 1 to 1048576"}},
		{"negative threads", []string{"--model", fixture.latest, "--threads", "-1"}, 2, []string{"--threads -1"}},
		{"no pairs", []string{"--model", fixture.latest, "--pairs"}, 2, []string{"-pairs"}},
	} {
		t.Run(c.name, func(t *testing.T) {
			code, out, stderr := classifyCmd(t, "", c.args...)
			if code != c.code || out != "" {
				t.Errorf("exit %d (want %d), stdout %q", code, c.code, out)
			}
			for _, w := range c.want {
				if !strings.Contains(stderr, w) {
					t.Errorf("stderr %q lacks %q", stderr, w)
				}
			}
		})
	}
}
