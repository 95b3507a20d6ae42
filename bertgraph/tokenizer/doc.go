// Package tokenizer is BERT's FullTokenizer in pure Go: basic tokenization followed by WordPiece.
// Its ids equal those of HF tokenizers' BertWordPieceTokenizer and of Google's tokenization.py on
// real text (the tests check 11,000 IMDB reviews and hand-made hard cases). Over all of Unicode
// the two references disagree in places; crosscheck_test.go documents which way we go and why,
// and the tests check every code point against both, allowing only those documented classes.
//
// Basic tokenization, in order:
//   - clean: U+0000, U+FFFD, invalid UTF-8 bytes, control and format characters (Unicode
//     categories Cc and Cf, except TAB, LF, CR) and private-use characters (Co) are dropped;
//     whitespace (TAB, LF, CR and Unicode White_Space) separates words;
//   - CJK ideographs (the ranges of tokenization.py's _is_chinese_char) become words of their own;
//   - with lower casing: NFD, non-spacing marks (Mn) dropped, then simple lower case mapping;
//   - every punctuation character (every non-alphanumeric printable ASCII character and Unicode
//     category P*) becomes a word of its own.
//
// WordPiece then splits each word greedily into the longest vocabulary entries, continuations
// carrying the "##" prefix; a word longer than MaxInputCharsPerWord code points, or one that cannot
// be covered by vocabulary entries, becomes the unknown token.
//
// Text such as "[SEP]" inside the input is tokenized as text ("[", "sep", "]"), never as the special
// token: only the feature conversion places [CLS] and [SEP].
//
// A Tokenizer is immutable after Load or New and safe for concurrent use.
//
//	tok, err := tokenizer.Load("vocab.txt", true)
//	ids := tok.Encode("Hello, world!") // [7592 1010 2088 999] with the uncased BERT vocabulary
package tokenizer
