package tokenizer

import (
	"fmt"
	"unicode"
	"unicode/utf8"

	"golang.org/x/text/unicode/norm"
)

// Options configure a Tokenizer. The zero value of a field means its BERT default.
type Options struct {
	// DoLowerCase lower-cases and strips accents (NFD, then non-spacing marks dropped), as the
	// uncased BERT checkpoints expect; it must match the checkpoint.
	DoLowerCase bool
	// MaxInputCharsPerWord: a word with more code points becomes the unknown token. BERT's
	// tokenization.py uses 200 (the default here); HF tokenizer.json files usually carry 100.
	MaxInputCharsPerWord int
	// UnknownToken defaults to "[UNK]"; it must be in the vocabulary.
	UnknownToken string
}

// Tokenizer is BERT's FullTokenizer: basic tokenization, then WordPiece over a Vocab.
type Tokenizer struct {
	vocab    *Vocab
	lower    bool
	maxChars int
	unk      int32
}

// Load reads vocab.txt and returns the tokenizer BERT builds with
// FullTokenizer(vocab_file, do_lower_case).
func Load(vocabPath string, doLowerCase bool) (*Tokenizer, error) {
	v, err := LoadVocab(vocabPath)
	if err != nil {
		return nil, err
	}
	t, err := New(v, Options{DoLowerCase: doLowerCase})
	if err != nil {
		return nil, fmt.Errorf("tokenizer: %s: %w", vocabPath, err)
	}
	return t, nil
}

// New returns a tokenizer over v.
func New(v *Vocab, opts Options) (*Tokenizer, error) {
	if opts.MaxInputCharsPerWord == 0 {
		opts.MaxInputCharsPerWord = 200
	}
	if opts.MaxInputCharsPerWord < 0 {
		return nil, fmt.Errorf("MaxInputCharsPerWord %d is negative", opts.MaxInputCharsPerWord)
	}
	if opts.UnknownToken == "" {
		opts.UnknownToken = "[UNK]"
	}
	unk, ok := v.ID(opts.UnknownToken)
	if !ok {
		return nil, fmt.Errorf("unknown token %q is not in the vocabulary", opts.UnknownToken)
	}
	return &Tokenizer{vocab: v, lower: opts.DoLowerCase, maxChars: opts.MaxInputCharsPerWord, unk: unk}, nil
}

// Vocab returns the vocabulary.
func (t *Tokenizer) Vocab() *Vocab { return t.vocab }

// DoLowerCase reports whether the tokenizer lower-cases and strips accents.
func (t *Tokenizer) DoLowerCase() bool { return t.lower }

// Encode returns the WordPiece ids of text, without [CLS] or [SEP].
func (t *Tokenizer) Encode(text string) []int32 { return t.AppendIDs(nil, text) }

// Tokenize returns the WordPiece tokens of text (FullTokenizer.tokenize).
func (t *Tokenizer) Tokenize(text string) []string {
	ids := t.Encode(text)
	toks := make([]string, len(ids))
	for i, id := range ids {
		toks[i] = t.vocab.tokens[id]
	}
	return toks
}

// scratch holds one call's word buffers; its arrays keep typical words off the heap.
type scratch struct {
	word, nfd, folded          []byte
	wordArr, nfdArr, foldedArr [128]byte
}

// AppendIDs appends the WordPiece ids of text to dst and returns it. Invalid UTF-8 bytes are
// dropped like U+FFFD, as the references do after decoding with replacement.
func (t *Tokenizer) AppendIDs(dst []int32, text string) []int32 {
	var s scratch
	s.word, s.nfd, s.folded = s.wordArr[:0], s.nfdArr[:0], s.foldedArr[:0]
	ascii := true
	for i := 0; i < len(text); {
		r, size := rune(text[i]), 1
		if r >= utf8.RuneSelf {
			r, size = utf8.DecodeRuneInString(text[i:])
		}
		switch classify(r) {
		case classWord, classPunct:
			s.word = append(s.word, text[i:i+size]...)
			ascii = ascii && size == 1
		case classSpace:
			dst = t.appendWord(dst, &s, ascii)
			ascii = true
		case classIdeograph:
			dst = t.appendWord(dst, &s, ascii)
			s.word = append(s.word, text[i:i+size]...)
			dst = t.appendWord(dst, &s, false)
			ascii = true
		}
		i += size
	}
	return t.appendWord(dst, &s, ascii)
}

// appendWord normalizes the whitespace-delimited word in s.word, splits it on punctuation and
// appends the WordPiece ids of each part; s.word is emptied.
func (t *Tokenizer) appendWord(dst []int32, s *scratch, ascii bool) []int32 {
	if len(s.word) == 0 {
		return dst
	}
	w := s.word
	s.word = s.word[:0]
	switch {
	case t.lower && ascii:
		for i, c := range w {
			w[i] = asciiLower[c]
		}
	case t.lower:
		s.nfd = norm.NFD.Append(s.nfd[:0], w...)
		s.folded = s.folded[:0]
		for _, r := range string(s.nfd) {
			if !unicode.Is(unicode.Mn, r) {
				s.folded = utf8.AppendRune(s.folded, unicode.ToLower(r))
			}
		}
		w = s.folded
	}
	start := 0
	if ascii {
		for i, c := range w {
			if asciiClass[c] == classPunct {
				dst = t.appendPieces(dst, w[start:i])
				dst = t.appendPieces(dst, w[i:i+1])
				start = i + 1
			}
		}
	} else {
		for i, r := range string(w) {
			if isPunct(r) {
				end := i + utf8.RuneLen(r)
				dst = t.appendPieces(dst, w[start:i])
				dst = t.appendPieces(dst, w[i:end])
				start = end
			}
		}
	}
	return t.appendPieces(dst, w[start:])
}

// appendPieces is WordPiece on one word: greedy longest-match-first from the left, continuations
// looked up with the "##" prefix, and the unknown token for the whole word when any position has
// no match or the word is longer than maxChars code points.
func (t *Tokenizer) appendPieces(dst []int32, word []byte) []int32 {
	if len(word) == 0 {
		return dst
	}
	if len(word) > t.maxChars && utf8.RuneCount(word) > t.maxChars {
		return append(dst, t.unk)
	}
	if id, ok := t.vocab.ids[string(word)]; ok {
		return append(dst, id)
	}
	mark := len(dst)
	for start := 0; start < len(word); {
		end := min(len(word), start+t.vocab.maxTokenBytes)
		found := false
		for ; end > start; end-- {
			if end < len(word) && !utf8.RuneStart(word[end]) {
				continue
			}
			var id int32
			var ok bool
			if start == 0 {
				id, ok = t.vocab.ids[string(word[:end])]
			} else {
				id, ok = t.vocab.continuations[string(word[start:end])]
			}
			if ok {
				dst = append(dst, id)
				found = true
				break
			}
		}
		if !found {
			return append(dst[:mark], t.unk)
		}
		start = end
	}
	return dst
}
