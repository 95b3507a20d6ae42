"""TensorFlow's side of the TFRecord cross-checks (Go tests call it with the project venv).

usage: tfrecord_ref.py READ_PATH READ_SEQ_LEN WRITE_PATH WRITE_SEQ_LEN N

Parses READ_PATH with tf.data.TFRecordDataset + tf.io.parse_single_example (run_classifier's
name_to_features), writes N random run_classifier records of WRITE_SEQ_LEN to WRITE_PATH with
tf.io.TFRecordWriter and tf.train.Example (as create_int_feature does), and prints
{"read": [...], "wrote": [...]} as JSON. One process does both: importing TensorFlow costs seconds.
"""
import json
import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

KEYS = ("input_ids", "input_mask", "segment_ids", "label_ids", "is_real_example")


def read(path: str, seq_len: int) -> list:
    name_to_features = {
        "input_ids": tf.io.FixedLenFeature([seq_len], tf.int64),
        "input_mask": tf.io.FixedLenFeature([seq_len], tf.int64),
        "segment_ids": tf.io.FixedLenFeature([seq_len], tf.int64),
        "label_ids": tf.io.FixedLenFeature([], tf.int64),
        "is_real_example": tf.io.FixedLenFeature([], tf.int64),
    }
    ds = tf.data.TFRecordDataset(path).map(lambda r: tf.io.parse_single_example(r, name_to_features))
    return [{k: v.numpy().tolist() for k, v in ex.items()} for ex in ds]


def write(path: str, seq_len: int, n: int) -> list:
    rng = np.random.default_rng(20260101)
    out = []
    with tf.io.TFRecordWriter(path) as w:
        for _ in range(n):
            used = int(rng.integers(2, seq_len + 1))
            ids = [101] + rng.integers(999, 30522, used - 2).tolist() + [102] + [0] * (seq_len - used)
            rec = {
                "input_ids": ids,
                "input_mask": [1] * used + [0] * (seq_len - used),
                "segment_ids": [0] * (used // 2) + [1] * (used - used // 2) + [0] * (seq_len - used),
                "label_ids": int(rng.integers(0, 3)),
                "is_real_example": int(rng.integers(0, 2)),
            }
            feats = {
                k: tf.train.Feature(int64_list=tf.train.Int64List(value=v if isinstance(v, list) else [v]))
                for k, v in rec.items()
            }
            w.write(tf.train.Example(features=tf.train.Features(feature=feats)).SerializeToString())
            out.append(rec)
    return out


def main() -> None:
    if len(sys.argv) != 6:
        sys.exit(__doc__)
    read_path, read_seq, write_path, write_seq, n = sys.argv[1:]
    json.dump({"read": read(read_path, int(read_seq)), "wrote": write(write_path, int(write_seq), int(n))}, sys.stdout)


if __name__ == "__main__":
    main()
