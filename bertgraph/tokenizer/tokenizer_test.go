package tokenizer

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// The vocabulary of tokenization_test.py in Google's BERT repository.
var smallVocab = []string{"[UNK]", "[CLS]", "[SEP]", "want", "##want", "##ed", "wa", "un", "runn", "##ing", ",", "low", "lowest"}

func newSmall(t *testing.T, lower bool) *Tokenizer {
	t.Helper()
	v, err := NewVocab(smallVocab)
	if err != nil {
		t.Fatal(err)
	}
	tok, err := New(v, Options{DoLowerCase: lower})
	if err != nil {
		t.Fatal(err)
	}
	return tok
}

func TestFullTokenizer(t *testing.T) {
	tok := newSmall(t, true)
	got := tok.Tokenize("UNwant\u00E9d,running")
	want := []string{"un", "##want", "##ed", ",", "runn", "##ing"}
	if !slices.Equal(got, want) {
		t.Fatalf("Tokenize = %q, want %q", got, want)
	}
	ids := tok.Encode("UNwant\u00E9d,running")
	if !slices.Equal(ids, []int32{7, 4, 5, 10, 8, 9}) {
		t.Fatalf("Encode = %v", ids)
	}
}

func TestWordPiece(t *testing.T) {
	tok := newSmall(t, false)
	for _, c := range []struct {
		in   string
		want []string
	}{
		{"", nil},
		{"unwanted running", []string{"un", "##want", "##ed", "runn", "##ing"}},
		{"unwantedX running", []string{"[UNK]", "runn", "##ing"}},
		{"lowest", []string{"lowest"}},
		// The vocabulary's longest token as the first piece of a longer word.
		{"lowesting", []string{"lowest", "##ing"}},
	} {
		if got := tok.Tokenize(c.in); !slices.Equal(got, c.want) {
			t.Errorf("Tokenize(%q) = %q, want %q", c.in, got, c.want)
		}
	}
}

func TestBasicTokenization(t *testing.T) {
	v, err := NewVocab(strings.Fields("[UNK] hello how are you ? ! ah hallo bonjour h ##ello hell ##o l ##ow 中 文 $ + ^ ` \u00e9 caf ##e / : @ { ~"))
	if err != nil {
		t.Fatal(err)
	}
	lower, _ := New(v, Options{DoLowerCase: true})
	cased, _ := New(v, Options{DoLowerCase: false})
	for _, c := range []struct {
		tok  *Tokenizer
		in   string
		want string
	}{
		{lower, " \tHeLLo!how  \n Are yoU?  ", "hello ! how are you ?"},
		{lower, "H\u00e9llo", "hello"},
		{lower, "ah\u535A\u63A8zz", "ah [UNK] [UNK] [UNK]"},
		{lower, "中文", "中 文"},
		{cased, "HeLLo", "[UNK]"},
		{cased, "café", "[UNK]"},
		{lower, "café", "caf ##e"},
		// Every non-alphanumeric ASCII character is punctuation.
		{lower, "a$b+c^d`e", "[UNK] $ [UNK] + [UNK] ^ [UNK] ` [UNK]"},
		// The ends of the four ASCII punctuation ranges ("[" is not in the vocabulary).
		{lower, "!h/h:h@h[h`h{h~", "! h / h : h @ h [UNK] h ` h { h ~"},
		// CJK Extension E from U+2B820, as tokenization.py (HF's range starts at U+2B920).
		{lower, "ah\U0002B820", "ah [UNK]"},
		// Control and zero-width format characters vanish; U+00A0 and U+2028 separate words.
		{lower, "hel\u0000lo\u200bw\x07orld", "[UNK]"},
		{lower, "hel\u0000lo", "hello"},
		// Private use vanishes too, as in HF (see isControl).
		{lower, "hel\ue000lo", "hello"},
		{lower, "hello\u00a0how\u2028are", "hello how are"},
		// Invalid UTF-8 bytes vanish like U+FFFD.
		{lower, "hel\xfflo \xe4\xb8", "hello"},
		{lower, "hel\ufffdlo", "hello"},
		{lower, "[SEP]", "[UNK] [UNK] [UNK]"},
	} {
		if got := strings.Join(c.tok.Tokenize(c.in), " "); got != c.want {
			t.Errorf("lower=%v Tokenize(%q) = %q, want %q", c.tok.lower, c.in, got, c.want)
		}
	}
}

func TestMaxInputCharsPerWord(t *testing.T) {
	v, _ := NewVocab([]string{"[UNK]", "a", "##a", "é", "##é"})
	tok, err := New(v, Options{MaxInputCharsPerWord: 4})
	if err != nil {
		t.Fatal(err)
	}
	for in, want := range map[string]string{
		"aaaa":  "a ##a ##a ##a",
		"aaaaa": "[UNK]",
		// Counted in code points, not bytes.
		"éééé":  "é ##é ##é ##é",
		"ééééé": "[UNK]",
	} {
		if got := strings.Join(tok.Tokenize(in), " "); got != want {
			t.Errorf("Tokenize(%q) = %q, want %q", in, got, want)
		}
	}
	long := strings.Repeat("a", 201)
	tok200, _ := New(v, Options{})
	if got := tok200.Tokenize(long); !slices.Equal(got, []string{"[UNK]"}) {
		t.Errorf("201 chars: %q, want [UNK] (BERT's default limit is 200)", got)
	}
	if got := tok200.Tokenize(long[1:]); len(got) != 200 {
		t.Errorf("200 chars: %d pieces, want 200", len(got))
	}
}

func TestVocab(t *testing.T) {
	dir := t.TempDir()
	write := func(name, body string) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
		return p
	}
	v, err := LoadVocab(write("crlf.txt", "[UNK]\r\nhello \t\r\n##lo\r\n"))
	if err != nil {
		t.Fatal(err)
	}
	if id, ok := v.ID("##lo"); !ok || id != 2 || v.Size() != 3 {
		t.Fatalf("ID(##lo) = %d %v, size %d", id, ok, v.Size())
	}
	if id, ok := v.ID("hello"); !ok || id != 1 {
		t.Fatalf("ID(hello) = %d %v: trailing whitespace not trimmed", id, ok)
	}
	ids, err := v.IDs([]string{"hello", "[UNK]"})
	if err != nil || !slices.Equal(ids, []int32{1, 0}) {
		t.Fatalf("IDs = %v, %v", ids, err)
	}
	toks, err := v.Tokens([]int32{2, 1})
	if err != nil || !slices.Equal(toks, []string{"##lo", "hello"}) {
		t.Fatalf("Tokens = %v, %v", toks, err)
	}
	if _, err := v.Tokens([]int32{3}); err == nil {
		t.Error("Tokens(3): no error for an id out of range")
	}
	if _, err := v.IDs([]string{"nope"}); err == nil {
		t.Error("IDs(nope): no error for an unknown token")
	}
	for name, body := range map[string]string{
		"dup.txt":   "[UNK]\na\nb\na\n",
		"blank.txt": "[UNK]\n\na\n",
		"empty.txt": "",
	} {
		_, err := LoadVocab(write(name, body))
		if err == nil || !strings.Contains(err.Error(), name) {
			t.Errorf("%s: err = %v, want an error naming the file", name, err)
		}
	}
	if _, err := LoadVocab(write("dup2.txt", "[UNK]\na\nb\na\n")); err == nil || !strings.Contains(err.Error(), "line 2 and line 4") {
		t.Errorf("duplicate: %v, want the two lines named", err)
	}
	if _, err := Load(write("nounk.txt", "a\nb\n"), true); err == nil || !strings.Contains(err.Error(), "[UNK]") {
		t.Errorf("no [UNK]: %v", err)
	}
}
