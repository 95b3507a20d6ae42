"""Drives the training SavedModel from Python TensorFlow: the reference Go's driver is checked
and benchmarked against.

    python -m bertgraph.exporter.drive steps   --model DIR --input steps.json --out result.json
    python -m bertgraph.exporter.drive serve   --model DIR --input batch.json --out result.json
    python -m bertgraph.exporter.drive bench   --model DIR --batch_size 32 --threads 2
    python -m bertgraph.exporter.drive fixture --out DIR

steps: runs train_step + apply_gradients for each batch of steps.json (keys as the signatures'
inputs, gradient_scale included, plus learning_rate and clip_norm at the top) on a fresh load of
the SavedModel and writes the losses, norms and final variables.  serve: serving_default of any SavedModel through
tf.saved_model.load.  bench: one train_step + apply_gradients on a synthetic batch per "step"
line of stdin, its seconds printed (see bench()), with --threads intra/inter-op threads.  fixture: what Go's bertgraph tests start from: a tiny
training SavedModel (model/) and a Google-named checkpoint of other weights with some names
missing and one extra (google/bert_model.ckpt).
"""
import argparse
import json
import pathlib
import resource
import sys
import time

import numpy as np


def _tf(threads=0):
    import tensorflow as tf
    if threads:
        tf.config.threading.set_intra_op_parallelism_threads(threads)
        tf.config.threading.set_inter_op_parallelism_threads(threads)
    return tf


def _batch(tf, d, keys):
    return {k: tf.constant(np.asarray(d[k], np.int64 if k == "dropout_seed" else np.int32))
            for k in keys}


TRAIN_KEYS = ("input_ids", "input_mask", "segment_ids", "label_ids", "is_real_example",
              "dropout_seed")
FEATURE_KEYS = ("input_ids", "input_mask", "segment_ids")


def steps(model_dir, spec):
    from . import contract
    tf = _tf()
    c = contract.read(model_dir)
    m = tf.saved_model.load(str(model_dir))
    grad_keys = [v["gradient_key"] for v in c["variables"]]
    lr = tf.constant(spec["learning_rate"], tf.float32)
    clip = tf.constant(spec["clip_norm"], tf.float32)
    result = {"losses": [], "correct": [], "global_norms": [], "applied": []}
    for step in spec["steps"]:
        out = m.signatures["train_step"](**_batch(tf, step, TRAIN_KEYS))
        applied = m.signatures["apply_gradients"](
            gradient_scale=tf.constant(step["gradient_scale"], tf.float32), learning_rate=lr,
            clip_norm=clip, **{k: out[k] for k in grad_keys})
        result["losses"].append(float(out["loss"]))
        result["correct"].append(int(out["correct"]))
        result["global_norms"].append(float(applied["global_norm"]))
        result["applied"].append(bool(applied["applied"]))
    values = m.signatures["read_variables"]()
    result["global_step"] = int(values["global_step"])
    result["variables"] = {v["name"]: values[v["value_key"]].numpy().ravel().tolist()
                           for v in c["variables"]}
    return result


def serve(model_dir, batch):
    tf = _tf()
    m = tf.saved_model.load(str(model_dir))
    out = m.signatures["serving_default"](**_batch(tf, batch, FEATURE_KEYS))
    return {k: v.numpy().tolist() for k, v in out.items()}


def bench(model_dir, batch_size, warmup, threads, commands=sys.stdin, reply=sys.stdout):
    """Serves timed steps on request, so a Go benchmark can alternate its steps with ours.

    Prints ``ready`` after the warm-up steps; then each input line ``step`` runs one
    train_step + apply_gradients (the gradients brought to host memory as numpy, as an allreduce
    needs them) and prints its seconds; at end of input prints {"peak_rss_mib": ...}."""
    from . import contract
    tf = _tf(threads)
    c = contract.read(model_dir)
    m = tf.saved_model.load(str(model_dir))
    seq = c["max_seq_length"]
    vocab = c["bert_config"]["vocab_size"]
    rng = np.random.default_rng(0)
    batch = {
        "input_ids": tf.constant(rng.integers(5, vocab, (batch_size, seq)).astype(np.int32)),
        "input_mask": tf.ones([batch_size, seq], tf.int32),
        "segment_ids": tf.zeros([batch_size, seq], tf.int32),
        "label_ids": tf.constant(rng.integers(0, c["num_labels"], batch_size).astype(np.int32)),
        "is_real_example": tf.ones([batch_size], tf.int32),
    }
    grad_keys = [v["gradient_key"] for v in c["variables"]]
    train, apply = m.signatures["train_step"], m.signatures["apply_gradients"]
    lr, clip, one = tf.constant(1e-5), tf.constant(1.0), tf.constant(1.0)

    def step(i):
        t0 = time.perf_counter()
        out = train(**batch, dropout_seed=tf.constant([0, i], tf.int64))
        grads = {k: out[k].numpy() for k in grad_keys}
        apply(gradient_scale=one, learning_rate=lr, clip_norm=clip, **grads)
        return time.perf_counter() - t0

    for i in range(warmup):
        step(-1 - i)
    print("ready", file=reply, flush=True)
    for i, line in enumerate(commands):
        if line.strip() != "step":
            raise SystemExit(f"drive.py bench: unknown command {line.strip()!r}")
        print(step(i), file=reply, flush=True)
    print(json.dumps({"peak_rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}),
          file=reply, flush=True)


def fixture(out_dir, max_seq_length=16, num_labels=2):
    from . import checkpoint, export
    from .config import TINY
    from .model import BertClassifier
    out_dir = pathlib.Path(out_dir)
    export.export_tiny(out_dir / "model", num_labels, max_seq_length, seed=1,
                       label_names=["neg", "pos"][:num_labels] if num_labels == 2 else None,
                       log=lambda s: None)
    donor = BertClassifier(TINY, num_labels, seed=2)
    values = {n: v.numpy() for n, v in donor.named_variables
              if n not in ("output_weights", "output_bias", "bert/pooler/dense/bias")}
    values["cls/predictions/output_bias"] = np.zeros(TINY.vocab_size, np.float32)
    (out_dir / "google").mkdir(parents=True, exist_ok=True)
    checkpoint.write(str(out_dir / "google/bert_model.ckpt"), values)
    return {"model": str(out_dir / "model"), "google": str(out_dir / "google/bert_model.ckpt")}


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("command", choices=("steps", "serve", "bench", "fixture"))
    p.add_argument("--model")
    p.add_argument("--input")
    p.add_argument("--out", help="result file (fixture: the folder to write)")
    p.add_argument("--batch_size", type=int, default=32)
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--threads", type=int, default=0, help="intra/inter-op threads; 0: TF default")
    a = p.parse_args(argv)
    if a.command != "bench" and not a.out:
        p.error(f"{a.command} needs --out")
    if a.command == "fixture":
        print(json.dumps(fixture(a.out)))
        return
    if not a.model:
        p.error(f"{a.command} needs --model")
    if a.command == "bench":
        bench(a.model, a.batch_size, a.warmup, a.threads)
        return
    if a.command == "steps":
        result = steps(a.model, json.loads(pathlib.Path(a.input).read_text()))
    elif a.command == "serve":
        result = serve(a.model, json.loads(pathlib.Path(a.input).read_text()))
    pathlib.Path(a.out).write_text(json.dumps(result))


if __name__ == "__main__":
    sys.exit(main())
