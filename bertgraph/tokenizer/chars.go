package tokenizer

import "unicode"

// charClass is what basic tokenization does with a character.
type charClass uint8

const (
	classWord      charClass = iota // part of a word
	classDrop                       // removed by text cleaning
	classSpace                      // separates words
	classPunct                      // a word of its own, split after normalization
	classIdeograph                  // a CJK ideograph: a word of its own, split before normalization
)

// asciiClass and asciiLower are the ASCII fast path of classify and lower casing.
var (
	asciiClass [128]charClass
	asciiLower [128]byte
)

func init() {
	for c := rune(0); c < 128; c++ {
		asciiClass[c] = classifySlow(c)
		asciiLower[c] = byte(unicode.ToLower(c))
	}
}

func classify(r rune) charClass {
	if r < 128 {
		return asciiClass[r]
	}
	return classifySlow(r)
}

func classifySlow(r rune) charClass {
	switch {
	case r == 0 || r == unicode.ReplacementChar:
		return classDrop
	case isSpace(r):
		return classSpace
	case isControl(r):
		return classDrop
	case isIdeograph(r):
		return classIdeograph
	case isPunct(r):
		return classPunct
	}
	return classWord
}

// isSpace: TAB, LF, CR and the Unicode White_Space property, less the ones that are controls
// (VT, FF, NEL are category Cc: cleaning drops them, as both references do).
func isSpace(r rune) bool {
	switch r {
	case '\t', '\n', '\r':
		return true
	}
	return unicode.Is(unicode.White_Space, r) && !unicode.Is(unicode.Cc, r)
}

// isControl: Unicode categories Cc and Cf, as tokenization.py's _is_control, and private use
// (Co), as HF tokenizers: a private-use code point means nothing outside the font it came from
// (IMDB reviews hold U+F0B7, a Symbol-font bullet pasted from a word processor), and dropping it
// keeps our ids equal to HF's on real text where tokenization.py would emit [UNK]. TAB, LF and CR
// are whitespace instead. Unassigned code points stay in their word, as in both references.
func isControl(r rune) bool {
	switch r {
	case '\t', '\n', '\r':
		return false
	}
	return unicode.In(r, unicode.Cc, unicode.Cf, unicode.Co)
}

// isPunct: every printable non-alphanumeric ASCII character (so "$", "+", "^", "`" split too) and
// Unicode category P*, as tokenization.py's _is_punctuation.
func isPunct(r rune) bool {
	if r < 128 {
		return r >= 33 && r <= 47 || r >= 58 && r <= 64 || r >= 91 && r <= 96 || r >= 123 && r <= 126
	}
	return unicode.IsPunct(r)
}

// isIdeograph: the CJK Unified Ideographs blocks of tokenization.py's _is_chinese_char. Hangul,
// Hiragana and Katakana are not in them and are tokenized like any other script.
func isIdeograph(r rune) bool {
	return r >= 0x4E00 && r <= 0x9FFF ||
		r >= 0x3400 && r <= 0x4DBF ||
		r >= 0x20000 && r <= 0x2A6DF ||
		r >= 0x2A700 && r <= 0x2B73F ||
		r >= 0x2B740 && r <= 0x2B81F ||
		r >= 0x2B820 && r <= 0x2CEAF ||
		r >= 0xF900 && r <= 0xFAFF ||
		r >= 0x2F800 && r <= 0x2FA1F
}
