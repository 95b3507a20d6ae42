"""Reference token ids for the Go tokenizer's cross-check tests.

usage: ref_tokenize.py IMPL --vocab VOCAB [--cased] [--max-chars N] < texts > ids
       ref_tokenize.py categories > categories

IMPL is the reference:
  hf       HF tokenizers' BertWordPieceTokenizer over VOCAB (max_input_chars_per_word = --max-chars)
  hf-json  HF tokenizers loading the tokenizer.json beside VOCAB, as shipped with the model
  google   Google's BERT tokenization.py (PyPI bert-tensorflow): BasicTokenizer + WordpieceTokenizer

stdin: one text a line, base64 of its raw bytes (so invalid UTF-8 and control characters survive
the trip); bytes that are not UTF-8 are decoded with replacement, as a Python caller must.
stdout: one line a text, its ids separated by spaces, no [CLS]/[SEP].

Text equal to a special token ("[SEP]") is tokenized as text, as BERT's tokenization.py does:
for HF, encode_special_tokens turns off its added-token matching.

`categories` prints Python's Unicode general category of every code point, one a line, so the
tests can tell which differences come from Unicode versions (Python's unicodedata vs Go's tables).
"""
import argparse
import base64
import collections
import os
import pathlib
import sys
import unicodedata


def hf(args):
    from tokenizers import Tokenizer
    from tokenizers.implementations import BertWordPieceTokenizer

    if args.impl == "hf-json":
        tok = Tokenizer.from_file(str(pathlib.Path(args.vocab).with_name("tokenizer.json")))
    else:
        tok = BertWordPieceTokenizer(args.vocab, lowercase=not args.cased)._tokenizer
        tok.model.max_input_chars_per_word = args.max_chars
    tok.no_truncation()
    tok.no_padding()
    tok.encode_special_tokens = True
    return lambda texts: [e.ids for e in tok.encode_batch(texts, add_special_tokens=False)]


def google(args):
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    from absl import flags

    flags.FLAGS.mark_as_parsed()  # tokenization.py reads FLAGS.preserve_unused_tokens (False)
    from bert import tokenization

    # FullTokenizer's load_vocab uses TF1's tf.gfile; the same dictionary, read directly.
    vocab = collections.OrderedDict()
    for line in open(args.vocab, encoding="utf-8"):
        vocab.setdefault(line.strip(), len(vocab))
    basic = tokenization.BasicTokenizer(do_lower_case=not args.cased, vocab=vocab)
    wordpiece = tokenization.WordpieceTokenizer(vocab=vocab, max_input_chars_per_word=args.max_chars)

    def encode(text):
        pieces = [p for word in basic.tokenize(text) for p in wordpiece.tokenize(word)]
        return tokenization.convert_tokens_to_ids(vocab, pieces)

    return lambda texts: [encode(t) for t in texts]


def main() -> None:
    if sys.argv[1:] == ["categories"]:
        sys.stdout.write("".join(unicodedata.category(chr(c)) + "\n" for c in range(0x110000)))
        return
    p = argparse.ArgumentParser()
    p.add_argument("impl", choices=("hf", "hf-json", "google"))
    p.add_argument("--vocab", required=True)
    p.add_argument("--cased", action="store_true")
    p.add_argument("--max-chars", type=int, default=200)
    args = p.parse_args()
    encode = google(args) if args.impl == "google" else hf(args)
    texts = [base64.b64decode(line).decode("utf-8", errors="replace") for line in sys.stdin.buffer.read().splitlines()]
    sys.stdout.write("".join(" ".join(map(str, ids)) + "\n" for ids in encode(texts)))


if __name__ == "__main__":
    main()
