package bertgraph

import (
	"encoding/json"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/gorovod/gorovod/bertgraph/features"
	"github.com/gorovod/gorovod/bertgraph/tokenizer"
)

// trainingVocab writes a vocabulary of the fixture's size that differs from the packaged one in
// order (the words reversed) and in case (every third word capitalised), so that a text
// tokenises to other ids under it than under the packaged vocabulary lower-cased.
func trainingVocab(t *testing.T, m *Model) string {
	t.Helper()
	packaged, err := os.ReadFile(m.VocabPath())
	if err != nil {
		t.Fatal(err)
	}
	tokens := strings.Fields(string(packaged))
	specials, words := tokens[:5], slices.Clone(tokens[5:])
	for i, w := range words {
		if i%3 == 0 {
			words[i] = strings.ToUpper(w[:1]) + w[1:]
		}
	}
	slices.Reverse(words)
	path := filepath.Join(t.TempDir(), "vocab.txt")
	if err := os.WriteFile(path, []byte(strings.Join(append(specials, words...), "\n")+"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	return path
}

// convert tokenises texts as training does: the given vocabulary and casing, run_classifier's
// single-sequence features.
func convert(t *testing.T, vocab string, lower bool, texts []string) *features.Batch {
	t.Helper()
	return convertKeepingTail(t, vocab, lower, 0, texts)
}

// convertKeepingTail is convert with head+tail truncation keeping tail tokens.
func convertKeepingTail(t *testing.T, vocab string, lower bool, tail int, texts []string) *features.Batch {
	t.Helper()
	tok, err := tokenizer.Load(vocab, lower)
	if err != nil {
		t.Fatal(err)
	}
	conv, err := features.NewConverter(tok, seqLength, nil)
	if err == nil {
		conv, err = conv.WithTailTokens(tail)
	}
	if err != nil {
		t.Fatal(err)
	}
	examples := make([]features.InputExample, len(texts))
	for i, s := range texts {
		examples[i] = features.InputExample{GUID: fmt.Sprint(i), TextA: s}
	}
	b, err := conv.ConvertBatch(examples, len(texts))
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// An export records the vocabulary, casing and label names the model was trained with: the
// Classifier on it, and Python tokenising with HF tokenizers from what the export packages,
// both reproduce the predictions of the training model on the training tokenisation.
func TestExportServingCarriesTheTrainingTokenisationAndLabels(t *testing.T) {
	m := trained(t)
	vocab := trainingVocab(t, m)
	texts := []string{"W3 w4 w100", "w70 W71 w90 W66", "w5 w6 w7 w8", "W120 unknownword w1", "w9 W9 w10 W10"}
	train := convert(t, vocab, false, texts)
	if slices.Equal(train.InputIDs, convert(t, m.VocabPath(), true, texts).InputIDs) {
		t.Fatal("the training tokenisation equals the packaged one: the test proves nothing")
	}
	want, err := m.Predict(train)
	if err != nil {
		t.Fatal(err)
	}
	export := filepath.Join(t.TempDir(), "serving")
	lower := false
	labels := []string{"bad", "good"}
	if err := m.ExportServing(export, ExportOptions{VocabFile: vocab, DoLowerCase: &lower, LabelNames: labels}); err != nil {
		t.Fatal(err)
	}
	c, err := ReadContract(export)
	if err != nil {
		t.Fatal(err)
	}
	if c.DoLowerCase || !slices.Equal(c.LabelNames, labels) || c.Kind != "serving" || c.MaxSeqLength != seqLength {
		t.Errorf("exported contract: do_lower_case %v, label_names %v, kind %q, max_seq_length %d", c.DoLowerCase, c.LabelNames, c.Kind, c.MaxSeqLength)
	}

	got, servedLabels := servedAsTrained(t, export, texts, want)
	if !slices.Equal(servedLabels, labels) {
		t.Errorf("classifier labels %v, want %v", servedLabels, labels)
	}
	for i, p := range got {
		if p.Label != labels[p.LabelID] {
			t.Errorf("text %q: label %q for id %d", texts[i], p.Label, p.LabelID)
		}
	}

	// Python: HF tokenizers over the export's vocabulary and casing, then serving_default.
	const script = `
import json, sys
import numpy as np
import tensorflow as tf
from tokenizers import BertWordPieceTokenizer
model, seq, texts = sys.argv[1], int(sys.argv[2]), json.loads(sys.argv[3])
contract = json.load(open(model + "/assets.extra/gorovod_contract.json"))
tok = BertWordPieceTokenizer(model + "/" + contract["vocab_file"], lowercase=contract["do_lower_case"])
tok.enable_truncation(seq)
ids = [e.ids + [0] * (seq - len(e.ids)) for e in tok.encode_batch(texts)]
mask = [[1 if i < len(e.ids) else 0 for i in range(seq)] for e in tok.encode_batch(texts)]
served = tf.saved_model.load(model)
p = served.signatures["serving_default"](input_ids=tf.constant(ids, tf.int32), input_mask=tf.constant(mask, tf.int32),
                                         segment_ids=tf.zeros([len(ids), seq], tf.int32))["probabilities"].numpy()
print(json.dumps({"ids": ids, "probabilities": p.astype(float).tolist(),
                  "labels": [contract["label_names"][k] for k in p.argmax(axis=1)]}))
`
	textsJSON, _ := json.Marshal(texts)
	out, err := venvPython("-c", script, export, fmt.Sprint(seqLength), string(textsJSON))
	if err != nil {
		t.Fatal(err)
	}
	var py struct {
		IDs           [][]int32
		Probabilities [][]float64
		Labels        []string
	}
	if err := json.Unmarshal(out, &py); err != nil {
		t.Fatalf("%v: %s", err, out)
	}
	for i := range texts {
		if !slices.Equal(py.IDs[i], train.Row(i).InputIDs) {
			t.Errorf("text %q: HF tokenizers on the export gives %v, training gave %v", texts[i], py.IDs[i], train.Row(i).InputIDs)
		}
		for j, v := range py.Probabilities[i] {
			if math.Abs(v-float64(got[i].Probabilities[j])) > 1e-5 {
				t.Errorf("text %q: Python %v, classifier %v", texts[i], py.Probabilities[i], got[i].Probabilities)
				break
			}
		}
		if py.Labels[i] != got[i].Label {
			t.Errorf("text %q: Python label %q, classifier %q", texts[i], py.Labels[i], got[i].Label)
		}
	}
}

// Options the serving model cannot honour are refused before anything is written.
func TestExportServingRefusesOptionsThatDoNotFit(t *testing.T) {
	m := loadFixture(t)
	dir := t.TempDir()
	noCLS := filepath.Join(dir, "nocls.txt")
	os.WriteFile(noCLS, []byte("[PAD]\n[UNK]\n[SEP]\nw0\n"), 0o644)
	big := filepath.Join(dir, "big.txt")
	words := []string{"[PAD]", "[UNK]", "[CLS]", "[SEP]"}
	for i := range 200 {
		words = append(words, fmt.Sprintf("w%d", i))
	}
	os.WriteFile(big, []byte(strings.Join(words, "\n")+"\n"), 0o644)
	for name, c := range map[string]struct {
		opts ExportOptions
		want string
	}{
		"missing vocabulary":       {ExportOptions{VocabFile: filepath.Join(dir, "nope.txt")}, "nope.txt"},
		"no [CLS]":                 {ExportOptions{VocabFile: noCLS}, "has no [CLS] token"},
		"beyond the embedding":     {ExportOptions{VocabFile: big}, "204 tokens but the model embeds only vocab_size 128"},
		"three labels":             {ExportOptions{LabelNames: []string{"a", "b", "c"}}, "3 label names (a,b,c) for a model of 2 labels"},
		"repeated label":           {ExportOptions{LabelNames: []string{"a", "a"}}, "non-empty and distinct"},
		"tail beyond the sequence": {ExportOptions{KeepTailTokens: seqLength - 1}, fmt.Sprintf("%d tail tokens for sequences of %d: want 0 to %d", seqLength-1, seqLength, seqLength-2)},
	} {
		export := filepath.Join(dir, "serving-"+strings.ReplaceAll(name, " ", "-"))
		err := m.ExportServing(export, c.opts)
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: %v, want an error containing %q", name, err, c.want)
		}
		if _, err := os.Stat(export); !os.IsNotExist(err) {
			t.Errorf("%s: %s was written", name, export)
		}
	}
}

// An export of a run trained with head+tail truncation (--keep_tail_tokens) records it, and the
// Classifier on it truncates long texts as training did, not to their head.
func TestExportServingCarriesHeadTailTruncation(t *testing.T) {
	m := trained(t)
	const tail = 9
	var words []string
	for i := range 3 * seqLength {
		words = append(words, fmt.Sprintf("w%d", (7*i)%100))
	}
	texts := []string{strings.Join(words, " "), strings.Join(words[seqLength:], " "), "w1 w2 w3"}
	headTail := convertKeepingTail(t, m.VocabPath(), true, tail, texts)
	if slices.Equal(headTail.InputIDs, convert(t, m.VocabPath(), true, texts).InputIDs) {
		t.Fatal("head+tail features equal the head's: the test proves nothing")
	}
	want, err := m.Predict(headTail)
	if err != nil {
		t.Fatal(err)
	}
	export := filepath.Join(t.TempDir(), "serving")
	// An export killed before it removed its staging directory: the next one removes it.
	stale := filepath.Join(filepath.Dir(export), ".serving.export-12345")
	if err := os.MkdirAll(filepath.Join(stale, "model", "variables"), 0o755); err != nil {
		t.Fatal(err)
	}
	// The staging of an export into a sibling named serving.export-x is that export's: it stays.
	sibling := filepath.Join(filepath.Dir(export), ".serving.export-x.export-678")
	if err := os.MkdirAll(sibling, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := m.ExportServing(export, ExportOptions{KeepTailTokens: tail}); err != nil {
		t.Fatal(err)
	}
	if left, _ := filepath.Glob(filepath.Join(filepath.Dir(export), ".*")); !slices.Equal(left, []string{sibling}) {
		t.Errorf("left beside the export: %v, want only the sibling's staging %s", left, sibling)
	}
	if c, err := ReadContract(export); err != nil || c.KeepTailTokens != tail {
		t.Fatalf("exported contract: keep_tail_tokens %v, %v; want %d", c, err, tail)
	}
	servedAsTrained(t, export, texts, want)
}

// servedAsTrained runs the Classifier on export over texts and checks that its probabilities are
// want's, the training model's on the training features (the same features through the same
// weights: only the session differs). It returns the predictions and the classifier's labels.
func servedAsTrained(t *testing.T, export string, texts []string, want *Predictions) ([]Prediction, []string) {
	t.Helper()
	cl, err := LoadClassifier(export, ClassifierOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	got, err := cl.Predict(texts)
	if err != nil {
		t.Fatal(err)
	}
	for i, p := range got {
		for j, v := range p.Probabilities {
			if math.Abs(float64(v-want.Row(i)[j])) > 1e-6 {
				t.Errorf("text %q: classifier %v, the training model on training features %v", texts[i], p.Probabilities, want.Row(i))
				break
			}
		}
	}
	return got, cl.Labels()
}
