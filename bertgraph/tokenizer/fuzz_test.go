package tokenizer

import (
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/gorovod/gorovod/bertgraph/datatests"
)

// checkInvariants holds for every input: no panic, ids in range, Tokenize agreeing with Encode,
// and whitespace separating words (the ids of "a b" are those of "a" then those of "b").
func checkInvariants(t *testing.T, tok *Tokenizer, a, b string) {
	ids := tok.Encode(a)
	for _, id := range ids {
		if id < 0 || int(id) >= tok.Vocab().Size() {
			t.Fatalf("Encode(%q): id %d out of range [0, %d)", a, id, tok.Vocab().Size())
		}
	}
	back, err := tok.Vocab().IDs(tok.Tokenize(a))
	if err != nil || !slices.Equal(back, ids) {
		t.Fatalf("Tokenize(%q) -> ids %v, %v; Encode %v", a, back, err, ids)
	}
	joined := tok.Encode(a + " " + b)
	if want := append(slices.Clone(ids), tok.Encode(b)...); !slices.Equal(joined, want) {
		t.Fatalf("Encode(%q + \" \" + %q) = %v, want %v", a, b, joined, want)
	}
}

// FuzzSmallVocab tokenizes against a vocabulary of a few pieces, where most words take the
// WordPiece backtracking and [UNK] paths.
func FuzzSmallVocab(f *testing.F) {
	for _, c := range hardCases {
		f.Add(c.text, "unwanted running")
	}
	v, err := NewVocab(append(slices.Clone(smallVocab), "é", "##é", "中", "##a", "a", "σ"))
	if err != nil {
		f.Fatal(err)
	}
	toks := make([]*Tokenizer, 0, 3)
	for _, o := range []Options{{DoLowerCase: true}, {}, {DoLowerCase: true, MaxInputCharsPerWord: 3}} {
		tok, err := New(v, o)
		if err != nil {
			f.Fatal(err)
		}
		toks = append(toks, tok)
	}
	f.Fuzz(func(t *testing.T, a, b string) {
		for _, tok := range toks {
			checkInvariants(t, tok, a, b)
		}
	})
}

// FuzzMiniLM tokenizes against the 30,522-piece vocabulary of the model the project fine-tunes.
func FuzzMiniLM(f *testing.F) {
	for _, c := range hardCases {
		f.Add(c.text, strings.ToUpper(c.text))
	}
	path := filepath.Join(datatests.MiniLMDir(f), "vocab.txt")
	lower, err := Load(path, true)
	if err != nil {
		f.Fatal(err)
	}
	cased, err := Load(path, false)
	if err != nil {
		f.Fatal(err)
	}
	f.Fuzz(func(t *testing.T, a, b string) {
		checkInvariants(t, lower, a, b)
		checkInvariants(t, cased, a, b)
	})
}
