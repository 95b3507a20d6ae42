"""Reference token ids for the Go tokenizer's cross-check tests.

usage: ref_tokenize.py IMPL --vocab VOCAB [--cased] [--max-chars N] < texts > ids
       ref_tokenize.py features {hf-json,run_classifier} --vocab VOCAB --max-seq-length N < pairs > features
       ref_tokenize.py categories > categories

IMPL is the reference:
  hf       HF tokenizers' BertWordPieceTokenizer over VOCAB (max_input_chars_per_word = --max-chars)
  hf-json  HF tokenizers loading the tokenizer.json beside VOCAB, as shipped with the model
  google   Google's BERT tokenization.py (PyPI bert-tensorflow): BasicTokenizer + WordpieceTokenizer

stdin: one text a line, base64 of its raw bytes (so invalid UTF-8 and control characters survive
the trip); bytes that are not UTF-8 are decoded with replacement, as a Python caller must.
stdout: one line a text, its ids separated by spaces, no [CLS]/[SEP].

`features` converts examples to run_classifier features of N tokens, with either the
tokenizer.json beside VOCAB as shipped (its [CLS]/[SEP] template, longest-first truncation and
padding set to N) or run_classifier.py's own convert_single_example over tokenization.py's
FullTokenizer (lower-cased). stdin lines are `base64(a)<TAB>base64(b)`, b empty for single
sequences; stdout lines are `input_ids|input_mask|segment_ids`, each space-separated.

Text equal to a special token ("[SEP]") is tokenized as text, as BERT's tokenization.py does:
for HF, encode_special_tokens turns off its added-token matching.

`categories` prints Python's Unicode general category of every code point, one a line, so the
tests can tell which differences come from Unicode versions (Python's unicodedata vs Go's tables).
"""
import argparse
import base64
import collections
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


def import_bert():
    """Imports Google's tokenization.py and run_classifier.py without TensorFlow.

    They use TensorFlow only to open files (tf.gfile: the vocabulary, the processors' TSV), to log
    and for flags; importing it
    would cost seconds of CPU per call, so a stand-in module provides exactly those. run_classifier
    also imports modeling and optimization, which need TF1's tf.contrib and play no part in the
    feature conversion.
    """
    import types

    from absl import flags, logging

    tf = types.ModuleType("tensorflow")
    tf.compat = types.ModuleType("tensorflow.compat")
    v1 = tf.compat.v1 = types.ModuleType("tensorflow.compat.v1")
    v1.gfile = types.SimpleNamespace(GFile=lambda path, mode: open(path, mode, encoding="utf-8"),
                                     Open=lambda path, mode: open(path, mode, encoding="utf-8"))
    v1.logging = logging
    v1.flags = flags
    sys.modules.update({"tensorflow": tf, "tensorflow.compat": tf.compat, "tensorflow.compat.v1": v1})
    for name in ("bert.modeling", "bert.optimization"):
        sys.modules[name] = types.ModuleType(name)
    from bert import run_classifier, tokenization

    flags.FLAGS.mark_as_parsed()  # tokenization.py reads FLAGS.preserve_unused_tokens (False)
    return tokenization, run_classifier


def google(args):
    tokenization, _ = import_bert()

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


def features(args) -> None:
    pairs = [[base64.b64decode(f).decode("utf-8") for f in line.split(b"\t")] for line in sys.stdin.buffer.read().splitlines()]
    if args.impl == "hf-json":
        from tokenizers import Tokenizer

        tok = Tokenizer.from_file(str(pathlib.Path(args.vocab).with_name("tokenizer.json")))
        tok.enable_truncation(max_length=args.max_seq_length, strategy="longest_first")
        tok.enable_padding(length=args.max_seq_length)
        tok.encode_special_tokens = True
        encs = [tok.encode(a, b) if b else tok.encode(a) for a, b in pairs]
        rows = [(e.ids, e.attention_mask, e.type_ids) for e in encs]
    else:
        tokenization, run_classifier = import_bert()
        tok = tokenization.FullTokenizer(args.vocab, do_lower_case=True)
        rows = []
        for i, (a, b) in enumerate(pairs):
            ex = run_classifier.InputExample(guid=str(i), text_a=a, text_b=b or None, label="0")
            f = run_classifier.convert_single_example(5, ex, ["0"], args.max_seq_length, tok)
            rows.append((f.input_ids, f.input_mask, f.segment_ids))
    for row in rows:
        sys.stdout.write("|".join(" ".join(map(str, x)) for x in row) + "\n")


def main() -> None:
    if sys.argv[1] == "features":
        p = argparse.ArgumentParser()
        p.add_argument("cmd")
        p.add_argument("impl", choices=("hf-json", "run_classifier"))
        p.add_argument("--vocab", required=True)
        p.add_argument("--max-seq-length", type=int, required=True)
        features(p.parse_args())
        return
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
