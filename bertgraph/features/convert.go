package features

import (
	"fmt"

	"github.com/gorovod/gorovod/bertgraph/tokenizer"
)

// Converter turns InputExamples into features (run_classifier.py's convert_single_example). It
// is immutable and safe for concurrent use.
type Converter struct {
	tok          *tokenizer.Tokenizer
	maxSeqLength int
	labels       *Labels
	cls, sep     int32
	tailTokens   int // WithTailTokens
}

// NewConverter returns a converter to sequences of maxSeqLength tokens, at least 3 ([CLS] and
// the two [SEP] of a pair). labels may be nil when every example is unlabelled.
func NewConverter(tok *tokenizer.Tokenizer, maxSeqLength int, labels *Labels) (*Converter, error) {
	if maxSeqLength < 3 {
		return nil, fmt.Errorf("features: max_seq_length %d is below 3", maxSeqLength)
	}
	c := &Converter{tok: tok, maxSeqLength: maxSeqLength, labels: labels}
	var ok bool
	if c.cls, ok = tok.Vocab().ID("[CLS]"); !ok {
		return nil, fmt.Errorf("features: the vocabulary has no [CLS]")
	}
	if c.sep, ok = tok.Vocab().ID("[SEP]"); !ok {
		return nil, fmt.Errorf("features: the vocabulary has no [SEP]")
	}
	return c, nil
}

// WithTailTokens returns a copy of c that truncates a single text longer than the sequence by
// keeping its first MaxSeqLength-2-n tokens and its last n ("head+tail" truncation, Sun et al.
// 2019, How to Fine-Tune BERT for Text Classification: the end of a long review says most about
// its label). n 0 is BERT's truncation, the head alone; n MaxSeqLength-2 keeps the tail alone.
// Pairs are truncated longest-first, as run_classifier, whatever n.
func (c *Converter) WithTailTokens(n int) (*Converter, error) {
	if n < 0 || n > c.maxSeqLength-2 {
		return nil, fmt.Errorf("features: %d tail tokens: want 0 to max_seq_length-2 = %d", n, c.maxSeqLength-2)
	}
	cp := *c
	cp.tailTokens = n
	return &cp, nil
}

// TailTokens is the n of WithTailTokens (0: the head alone).
func (c *Converter) TailTokens() int { return c.tailTokens }

// MaxSeqLength is the length of every converted sequence.
func (c *Converter) MaxSeqLength() int { return c.maxSeqLength }

// Labels is the label map (nil for unlabelled conversion).
func (c *Converter) Labels() *Labels { return c.labels }

// Convert returns the features of ex.
func (c *Converter) Convert(ex InputExample) (InputFeatures, error) {
	n := c.maxSeqLength
	buf := make([]int32, 3*n)
	f := InputFeatures{InputIDs: buf[:n:n], InputMask: buf[n : 2*n : 2*n], SegmentIDs: buf[2*n:], IsRealExample: true}
	var err error
	f.LabelID, err = c.convertInto(ex, f.InputIDs, f.InputMask, f.SegmentIDs, nil)
	return f, err
}

// convertInto writes ex's features into ids, mask and segs (each maxSeqLength long, zeroed by the
// caller) and returns its label id. scratch is reused for the token ids of the texts.
func (c *Converter) convertInto(ex InputExample, ids, mask, segs []int32, scratch *[]int32) (int32, error) {
	var label int32
	if ex.Label != "" {
		if c.labels == nil {
			return 0, fmt.Errorf("features: %s: label %q given but the converter has no label list", ex.GUID, ex.Label)
		}
		var ok bool
		if label, ok = c.labels.ID(ex.Label); !ok {
			return 0, fmt.Errorf("features: %s: label %q is not in the label list %q", ex.GUID, ex.Label, c.labels.names)
		}
	}
	var local []int32
	if scratch == nil {
		scratch = &local
	}
	toks := c.tok.AppendIDs((*scratch)[:0], ex.TextA)
	nA := len(toks)
	toks = c.tok.AppendIDs(toks, ex.TextB)
	nB := len(toks) - nA
	*scratch = toks
	a, b := toks[:nA], toks[nA:]
	// As run_classifier, a text b without tokens (empty, or only dropped characters) makes a
	// single-sequence example: no second [SEP].
	pair := nB > 0
	if pair {
		// _truncate_seq_pair: drop the last token of the longer sequence, of b on a tie, until
		// both fit beside [CLS] and two [SEP].
		for nA+nB > c.maxSeqLength-3 {
			if nA > nB {
				nA--
			} else {
				nB--
			}
		}
		a, b = a[:nA], b[:nB]
		// run_classifier tests tokens_b after the truncation: a b truncated away (max_seq_length
		// 3 or 4) leaves a single sequence too.
		pair = nB > 0
	} else if keep := c.maxSeqLength - 2; nA > keep {
		head := keep - c.tailTokens
		// The tail moves down next to the head, within toks (scratch), which a does not outlive.
		copy(a[head:], a[nA-c.tailTokens:])
		a = a[:keep]
	}
	p := 0
	ids[p] = c.cls
	p++
	p += copy(ids[p:], a)
	ids[p] = c.sep
	p++
	if pair {
		q := p
		p += copy(ids[p:], b)
		ids[p] = c.sep
		p++
		for i := q; i < p; i++ {
			segs[i] = 1
		}
	}
	for i := range p {
		mask[i] = 1
	}
	return label, nil
}
