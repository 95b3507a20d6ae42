package tokenizer

import (
	"bufio"
	"bytes"
	"fmt"
	"os"
	"strings"
)

// continuationPrefix marks a WordPiece that continues a word.
const continuationPrefix = "##"

// Vocab maps WordPiece tokens to ids: the id of a token is its 0-based line number in vocab.txt.
type Vocab struct {
	tokens []string
	ids    map[string]int32
	// continuations maps a "##x" entry by its suffix "x", so WordPiece looks continuations up
	// without building the prefixed string.
	continuations map[string]int32
	// maxTokenBytes bounds the longest piece WordPiece needs to try.
	maxTokenBytes int
}

// LoadVocab reads a vocab.txt: one token a line, LF or CRLF endings, trailing spaces and tabs
// ignored (both references trim them). Empty lines and duplicate tokens are errors naming the
// file and line: the references would load them as tokens "" and a shadowed id.
func LoadVocab(path string) (*Vocab, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("tokenizer: reading vocabulary: %w", err)
	}
	data = bytes.TrimPrefix(data, []byte("\ufeff"))
	var tokens []string
	sc := bufio.NewScanner(bytes.NewReader(data))
	sc.Buffer(make([]byte, 0, 1024), len(data)+1)
	for line := 1; sc.Scan(); line++ {
		tok := strings.TrimRight(sc.Text(), " \t\r")
		if tok == "" {
			return nil, fmt.Errorf("tokenizer: %s:%d: empty token", path, line)
		}
		tokens = append(tokens, tok)
	}
	if len(tokens) == 0 {
		return nil, fmt.Errorf("tokenizer: %s: no tokens", path)
	}
	v, err := NewVocab(tokens)
	if err != nil {
		return nil, fmt.Errorf("tokenizer: %s: %w", path, err)
	}
	return v, nil
}

// NewVocab builds a vocabulary from tokens in id order.
func NewVocab(tokens []string) (*Vocab, error) {
	v := &Vocab{
		tokens:        append([]string(nil), tokens...),
		ids:           make(map[string]int32, len(tokens)),
		continuations: make(map[string]int32),
	}
	for i, tok := range v.tokens {
		if tok == "" {
			return nil, fmt.Errorf("token %d is empty", i)
		}
		if prev, dup := v.ids[tok]; dup {
			return nil, fmt.Errorf("token %q appears twice: line %d and line %d", tok, prev+1, i+1)
		}
		v.ids[tok] = int32(i)
		if rest, ok := strings.CutPrefix(tok, continuationPrefix); ok && rest != "" {
			v.continuations[rest] = int32(i)
		}
		v.maxTokenBytes = max(v.maxTokenBytes, len(tok))
	}
	return v, nil
}

// Size is the number of tokens; every id is in [0, Size).
func (v *Vocab) Size() int { return len(v.tokens) }

// ID returns the id of token.
func (v *Vocab) ID(token string) (int32, bool) {
	id, ok := v.ids[token]
	return id, ok
}

// Token returns the token of id.
func (v *Vocab) Token(id int32) (string, bool) {
	if id < 0 || int(id) >= len(v.tokens) {
		return "", false
	}
	return v.tokens[id], true
}

// IDs converts tokens to ids (tokenization.py's convert_tokens_to_ids); an unknown token is an error.
func (v *Vocab) IDs(tokens []string) ([]int32, error) {
	ids := make([]int32, len(tokens))
	for i, t := range tokens {
		id, ok := v.ids[t]
		if !ok {
			return nil, fmt.Errorf("tokenizer: token %q is not in the vocabulary", t)
		}
		ids[i] = id
	}
	return ids, nil
}

// Tokens converts ids to tokens (convert_ids_to_tokens); an id out of range is an error.
func (v *Vocab) Tokens(ids []int32) ([]string, error) {
	toks := make([]string, len(ids))
	for i, id := range ids {
		t, ok := v.Token(id)
		if !ok {
			return nil, fmt.Errorf("tokenizer: id %d is out of range [0, %d)", id, len(v.tokens))
		}
		toks[i] = t
	}
	return toks, nil
}
