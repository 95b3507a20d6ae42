package features

import (
	"bytes"
	"encoding/base64"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"

	"github.com/gorovod/gorovod/bertgraph/datatests"
	"github.com/gorovod/gorovod/bertgraph/tokenizer"
)

func miniLMTokenizer(t testing.TB, maxChars int) (*tokenizer.Tokenizer, string) {
	t.Helper()
	path := filepath.Join(datatests.MiniLMDir(t), "vocab.txt")
	v, err := tokenizer.LoadVocab(path)
	if err != nil {
		t.Fatal(err)
	}
	tok, err := tokenizer.New(v, tokenizer.Options{DoLowerCase: true, MaxInputCharsPerWord: maxChars})
	if err != nil {
		t.Fatal(err)
	}
	return tok, path
}

// The IMDB dev split over 3 ranks: every line read by exactly one rank, the streamed parallel
// conversion equal to the sequential one, and the features equal to run_classifier.py's
// convert_single_example, and for single sequences to HF tokenizers' encoding with the model's
// tokenizer.json ([CLS]/[SEP] template, truncation, padding).
func TestIMDBShardsConvertLikeHF(t *testing.T) {
	path := datatests.IMDB(t, "dev")
	raw, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	lines := bytes.Count(raw, []byte{'\n'})
	labels, err := LabelsFromFile(path, ReadOptions{})
	if err != nil || !slices.Equal(labels.Names(), []string{"0", "1"}) {
		t.Fatalf("labels %v, %v", labels, err)
	}
	tok, vocab := miniLMTokenizer(t, 0)
	const seq = 128
	conv, err := NewConverter(tok, seq, labels)
	if err != nil {
		t.Fatal(err)
	}
	// tokenizer.json caps words at 100 characters where tokenization.py has 200.
	tok100, _ := miniLMTokenizer(t, 100)
	conv100, err := NewConverter(tok100, seq, labels)
	if err != nil {
		t.Fatal(err)
	}
	var all []InputExample
	read := 0
	for rank := range 3 {
		r, err := Open(path, ReadOptions{Rank: rank, Size: 3, Labels: labels})
		if err != nil {
			t.Fatal(err)
		}
		batches := drainStream(t, conv.Stream(r, StreamOptions{BatchSize: 32, Workers: 4}))
		c := r.Counts()
		r.Close()
		if c.Lines != lines || c.Skipped != 0 {
			t.Errorf("rank %d counts %+v, file has %d lines", rank, c, lines)
		}
		read += c.Read
		// The same examples, sequentially.
		r2, _ := Open(path, ReadOptions{Rank: rank, Size: 3})
		var exs []InputExample
		for {
			ex, err := r2.Next()
			if err != nil {
				break
			}
			exs = append(exs, ex)
		}
		r2.Close()
		if len(exs) != c.Read || len(batches) != (len(exs)+31)/32 {
			t.Fatalf("rank %d: %d examples, %d batches, counts %+v", rank, len(exs), len(batches), c)
		}
		for i, b := range batches {
			want, _ := conv.ConvertBatch(exs[i*32:min(len(exs), (i+1)*32)], min(len(exs)-i*32, 32))
			if !slices.Equal(b.InputIDs, want.InputIDs) || !slices.Equal(b.GUIDs, want.GUIDs) || !slices.Equal(b.LabelIDs, want.LabelIDs) {
				t.Fatalf("rank %d batch %d: parallel conversion differs from sequential", rank, i)
			}
		}
		all = append(all, exs...)
	}
	if read != lines {
		t.Errorf("ranks read %d examples, the file has %d lines", read, lines)
	}
	// Singles and pairs (review i with review i+1: truncation on every side) against HF.
	exs := make([]InputExample, 0, 2000)
	for i := range 1000 {
		exs = append(exs, InputExample{TextA: all[i].TextA, Label: all[i].Label})
		exs = append(exs, InputExample{TextA: all[i].TextA[:len(all[i].TextA)/(1+i%7)], TextB: all[i+1].TextA, Label: all[i].Label})
	}
	var in bytes.Buffer
	for _, ex := range exs {
		fmt.Fprintf(&in, "%s\t%s\n", base64.StdEncoding.EncodeToString([]byte(ex.TextA)), base64.StdEncoding.EncodeToString([]byte(ex.TextB)))
	}
	var hf, rc []string
	var wg sync.WaitGroup
	reference := func(impl string) []string {
		out := datatests.RunPython(t, in.Bytes(), "ref_tokenize.py", "features", impl, "--vocab", vocab, "--max-seq-length", strconv.Itoa(seq))
		return strings.Split(strings.TrimSpace(string(out)), "\n")
	}
	wg.Go(func() { hf = reference("hf-json") })
	wg.Go(func() { rc = reference("run_classifier") })
	wg.Wait()
	if t.Failed() {
		return
	}
	if len(hf) != len(exs) || len(rc) != len(exs) {
		t.Fatalf("%d HF and %d run_classifier encodings for %d examples", len(hf), len(rc), len(exs))
	}
	// HF breaks longest-first ties the other way (the extra token goes to b, run_classifier's
	// _truncate_seq_pair gives it to a): pairs are compared with run_classifier only.
	badHF, badRC := 0, 0
	for i, ex := range exs {
		f, err := conv.Convert(ex)
		if err != nil {
			t.Fatal(err)
		}
		got := ints(f.InputIDs) + "|" + ints(f.InputMask) + "|" + ints(f.SegmentIDs)
		if got != rc[i] {
			if badRC++; badRC <= 3 {
				t.Errorf("example %d (pair %v):\n ours %v\n   run_classifier %v", i, ex.TextB != "", got, rc[i])
			}
		}
		f100, _ := conv100.Convert(ex)
		if got := ints(f100.InputIDs) + "|" + ints(f100.InputMask) + "|" + ints(f100.SegmentIDs); ex.TextB == "" && got != hf[i] {
			if badHF++; badHF <= 3 {
				t.Errorf("example %d:\n ours %v\n   hf %v", i, got, hf[i])
			}
		}
	}
	if badRC+badHF > 0 {
		t.Errorf("of %d examples, %d differ from run_classifier, %d singles from HF", len(exs), badRC, badHF)
	}
}

func ints(xs []int32) string {
	s := make([]string, len(xs))
	for i, x := range xs {
		s[i] = strconv.Itoa(int(x))
	}
	return strings.Join(s, " ")
}
