package main

import (
	"errors"
	"io"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"github.com/gorovod/gorovod/bertgraph/features"
	"github.com/gorovod/gorovod/bertgraph/tfrecord"
	"github.com/gorovod/gorovod/bertgraph/tokenizer"
	records "github.com/gorovod/gorovod/tf/tfrecord"
)

// A rank's train.tf_record holds its lines (i % size == rank) of the first max_train_examples,
// and is reused only while everything it depends on stays the same.
func TestTrainFeaturesShardLimitAndReuse(t *testing.T) {
	dir := t.TempDir()
	conv, vocab := binaryConverter(t, dir, 50, 8)
	train := filepath.Join(dir, "train.tsv")
	lines := "0\tw5 w6\n1\tw7\n0\tw8 w9 w10\n1\tw11\n0\tw12\n1\tw13 w14\n0\tw15\n1\tw16\n0\tw17\n1\tw18\n"
	os.WriteFile(train, []byte(lines), 0o644)
	in := &inputs{train: train, vocabPath: vocab, rankDir: filepath.Join(dir, "out")}
	os.MkdirAll(in.rankDir, 0o755)
	c := &Config{MaxSeqLength: 8, DoLowerCase: true}

	check := func(wantReused bool, wantExamples int) string {
		t.Helper()
		path, cache, reused, err := trainFeatures(c, in, conv, 1, 2, &stopper{})
		if err != nil {
			t.Fatal(err)
		}
		if reused != wantReused || cache.Examples != wantExamples {
			t.Fatalf("reused=%v examples=%d, want %v %d", reused, cache.Examples, wantReused, wantExamples)
		}
		return path
	}
	path := check(false, 5) // rank 1 of 2: lines 1, 3, 5, 7, 9
	check(true, 5)

	// The records are rank 1's lines in order: "1 w7" first.
	f, _ := os.Open(path)
	defer f.Close()
	rec, err := records.NewReader(f, path).Next()
	if err != nil {
		t.Fatal(err)
	}
	feat, err := tfrecord.DecodeFeatures(rec, 8)
	if err != nil {
		t.Fatal(err)
	}
	voc, err := tokenizer.LoadVocab(vocab)
	if err != nil {
		t.Fatal(err)
	}
	cls, _ := voc.ID("[CLS]")
	sep, _ := voc.ID("[SEP]")
	w7, _ := voc.ID("w7")
	if feat.LabelID != 1 || feat.InputIDs[0] != cls || feat.InputIDs[1] != w7 || feat.InputIDs[2] != sep || feat.InputMask[3] != 0 {
		t.Fatalf("first record %+v", feat)
	}

	c.MaxTrainExamples = 6 // lines 0..5: rank 1 keeps 1, 3, 5
	check(false, 3)
	check(true, 3)
	os.WriteFile(train, []byte(lines+"0\tw19\n1\tw20\n"), 0o644) // the file changed
	check(false, 3)
	c.MaxSeqLength = 16
	conv, _ = binaryConverter(t, t.TempDir(), 50, 16) // the same vocabulary, 16 tokens
	check(false, 3)
	conv, _ = conv.WithTailTokens(4) // --keep_tail_tokens: other features for long lines
	check(false, 3)
	check(true, 3)
	// A conversion killed before its key was written is not reused.
	os.Remove(path + ".key.json")
	check(false, 3)

	// A signal stops the conversion before it commits: no key, so the next run converts again.
	c.MaxTrainExamples = 0
	signalled := &stopper{}
	signalled.sig.Store(os.Signal(syscall.SIGINT))
	_, _, _, err = trainFeatures(c, in, conv, 1, 2, signalled)
	var intr errInterrupted
	if !errors.As(err, &intr) || intr.sig != syscall.SIGINT {
		t.Fatalf("conversion under SIGINT: err = %v", err)
	}
	if _, err := os.Stat(path + ".key.json"); !os.IsNotExist(err) {
		t.Errorf("the interrupted conversion left its key: %v", err)
	}
	if tmp, _ := filepath.Glob(filepath.Join(in.rankDir, ".*tmp*")); tmp != nil {
		t.Errorf("the interrupted conversion left %v", tmp)
	}
	check(false, 6) // all 12 lines now: rank 1 keeps 6

	// A conversion killed harder (kill -9) left its temporary files: the next one removes them.
	for _, name := range []string{".train.tf_record.tmp1a2b", ".train.tf_record.key.json.tmp3c"} {
		os.WriteFile(filepath.Join(in.rankDir, name), []byte("half"), 0o644)
	}
	os.Remove(path + ".key.json")
	check(false, 6)
	if tmp, _ := filepath.Glob(filepath.Join(in.rankDir, ".*tmp*")); tmp != nil {
		t.Errorf("the conversion after a killed one left %v", tmp)
	}
}

// --skip_bad_lines skips and counts a bad dev line, but a bad test line stays an error naming
// file:line: skipping it would shift every later row of test_results.tsv off its line of
// test.tsv, which is how a GLUE submission is matched.
func TestSkipBadLinesNeverSkipsTestLines(t *testing.T) {
	dir := t.TempDir()
	conv, _ := binaryConverter(t, dir, 20, 8)
	bad := []byte("1\tw5 w6\n\n0\tw7\n") // line 2 is blank
	dev, test := filepath.Join(dir, "dev.tsv"), filepath.Join(dir, "test.tsv")
	os.WriteFile(dev, bad, 0o644)
	os.WriteFile(test, bad, 0o644)
	c := &Config{SkipBadLines: true}

	readAll := func(path string, labelled bool, limit int) (int, features.Counts, error) {
		t.Helper()
		stream, r, err := evalStream(c, path, conv, 4, limit, labelled)
		if err != nil {
			t.Fatal(err)
		}
		defer r.Close()
		defer stream.Close()
		n := 0
		for {
			b, err := stream.Next()
			if errors.Is(err, io.EOF) {
				return n, r.Counts(), nil
			}
			if err != nil {
				return n, r.Counts(), err
			}
			n += b.NumReal()
		}
	}
	n, counts, err := readAll(dev, true, 0)
	if err != nil || n != 2 || counts.Skipped != 1 {
		t.Errorf("dev with --skip_bad_lines: %d examples, %d skipped, err %v; want 2, 1, nil", n, counts.Skipped, err)
	}
	_, counts, err = readAll(test, false, 0)
	var le *features.LineError
	if !errors.As(err, &le) || le.Path != test || le.Line != 2 || !strings.Contains(err.Error(), test+":2:") {
		t.Errorf("test with --skip_bad_lines: err %v (%d skipped), want a LineError at %s:2", err, counts.Skipped, test)
	}
	// --max_predict_examples=1 ends test.tsv before the bad line: it is never read.
	if n, counts, err := readAll(test, false, 1); err != nil || n != 1 || counts.Lines != 1 {
		t.Errorf("the first line of test.tsv: %d examples of %d lines, err %v; want 1 of 1, nil", n, counts.Lines, err)
	}
}

// A train.tf_record cut short since its key was written (cut at a record boundary, no record
// reads as damaged) is converted again: reused, its rank would repeat the records left as if
// they were all its examples, which the key still counts.
func TestTrainFeaturesCutShortIsConvertedAgain(t *testing.T) {
	dir := t.TempDir()
	conv, vocab := binaryConverter(t, dir, 50, 8)
	train := filepath.Join(dir, "train.tsv")
	os.WriteFile(train, []byte("0\tw5 w6\n1\tw7\n0\tw8 w9 w10\n1\tw11\n"), 0o644)
	in := &inputs{train: train, vocabPath: vocab, rankDir: dir}
	c := &Config{MaxSeqLength: 8, DoLowerCase: true}
	path, _, _, err := trainFeatures(c, in, conv, 0, 1, &stopper{})
	if err != nil {
		t.Fatal(err)
	}
	f, _ := os.Open(path)
	r := records.NewReader(f, path)
	if _, err := r.Next(); err != nil {
		t.Fatal(err)
	}
	f.Close()
	if err := os.Truncate(path, r.Offset()); err != nil { // one whole record of four left
		t.Fatal(err)
	}
	_, cache, reused, err := trainFeatures(c, in, conv, 0, 1, &stopper{})
	if err != nil || reused || cache.Examples != 4 {
		t.Fatalf("after the cut: reused=%v examples=%d err=%v, want a new conversion of 4", reused, cache.Examples, err)
	}
	if _, _, reused, err := trainFeatures(c, in, conv, 0, 1, &stopper{}); err != nil || !reused {
		t.Fatalf("the new conversion is not reused: reused=%v err=%v", reused, err)
	}
}
