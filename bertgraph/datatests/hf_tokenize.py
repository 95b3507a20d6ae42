"""Reference token ids from HF `tokenizers`, for the Go tokenizer's cross-check tests.

usage: hf_tokenize.py (--vocab VOCAB [--cased] [--max-chars N] | --tokenizer-json PATH) < texts > ids

stdin: one text a line, base64 of its raw bytes (so invalid UTF-8 and control characters survive
the trip); bytes that are not UTF-8 are decoded with replacement, as a Python caller must.
stdout: one line a text, its ids separated by spaces, no [CLS]/[SEP].

Text equal to a special token ("[SEP]") is tokenized as text, as BERT's tokenization.py does:
encode_special_tokens turns off the added-token matching HF does by default.
"""
import argparse
import base64
import sys

from tokenizers import Tokenizer
from tokenizers.implementations import BertWordPieceTokenizer


def reference(args) -> Tokenizer:
    if args.tokenizer_json:
        tok = Tokenizer.from_file(args.tokenizer_json)
    else:
        tok = BertWordPieceTokenizer(args.vocab, lowercase=not args.cased)._tokenizer
        tok.model.max_input_chars_per_word = args.max_chars
    tok.no_truncation()
    tok.no_padding()
    tok.encode_special_tokens = True
    return tok


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--vocab")
    p.add_argument("--cased", action="store_true")
    p.add_argument("--max-chars", type=int, default=200)
    p.add_argument("--tokenizer-json")
    args = p.parse_args()
    tok = reference(args)
    texts = [base64.b64decode(line).decode("utf-8", errors="replace") for line in sys.stdin.buffer.read().splitlines()]
    out = sys.stdout
    for enc in tok.encode_batch(texts, add_special_tokens=False):
        out.write(" ".join(map(str, enc.ids)) + "\n")


if __name__ == "__main__":
    main()
