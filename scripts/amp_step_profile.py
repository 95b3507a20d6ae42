"""The training SavedModel's train step in float32, bfloat16 and float16 side by side, and
float32's step under TensorFlow's own bfloat16 rewrite (Grappler's
auto_mixed_precision_onednn_bfloat16) for comparison with the exported graph's policy.

    TF_CPP_MIN_LOG_LEVEL=2 .venv/bin/python scripts/amp_step_profile.py .cache/model/imdb_minilm 16 3 [BASELINE]

Loads the SavedModel in two TensorFlow sessions (1 intra-op, 1 inter-op thread each; the second
with the Grappler rewrite on), runs train_step, train_step_bfloat16 and train_step_float16 in the
first and train_step in the second on one synthetic batch of the given size, interleaved for the
given number of rounds (so a busy machine disturbs all four alike), prints each one's median and
the ratios, then one traced run of each with the time per op type (the ten largest).
docs/mixed-precision.md has the figures.

BASELINE, another export of the same model (say, by the exporter before a change), adds its
train_step, train_step_bfloat16 and eval_step, in a session of their own, and this export's
eval_step to the interleaved rounds, and prints each one's time over this export's: a change to
the exporter measured side by side.
"""
import collections
import sys
import time

import numpy as np
import tensorflow as tf
from tensorflow.core.protobuf import config_pb2, rewriter_config_pb2

tf.compat.v1.disable_eager_execution()
d, batch, rounds = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
baseline = sys.argv[4] if len(sys.argv) > 4 else None
REWRITE = "train_step + Grappler bfloat16 rewrite"
BASELINE = "baseline "


def session(rewrite, d=d):
    cfg = tf.compat.v1.ConfigProto(intra_op_parallelism_threads=1, inter_op_parallelism_threads=1)
    if rewrite:
        cfg.graph_options.rewrite_options.auto_mixed_precision_onednn_bfloat16 = \
            rewriter_config_pb2.RewriterConfig.ON
    s = tf.compat.v1.Session(graph=tf.Graph(), config=cfg)
    with s.graph.as_default():
        return s, tf.compat.v1.saved_model.load(s, ["serve"], d)


plain, mg = session(False)
rewritten, mg_rewritten = session(True)
# name: (session, signature)
steps = {k: (plain, mg.signature_def[k]) for k in ("train_step", "train_step_bfloat16", "train_step_float16")}
steps[REWRITE] = (rewritten, mg_rewritten.signature_def["train_step"])
if baseline:
    steps["eval_step"] = (plain, mg.signature_def["eval_step"])
    base_session, mg_base = session(False, baseline)
    for k in ("train_step", "train_step_bfloat16", "eval_step"):
        steps[BASELINE + k] = (base_session, mg_base.signature_def[k])
seq = steps["train_step"][1].inputs["input_ids"].tensor_shape.dim[1].size
rng = np.random.default_rng(0)
vals = {"input_ids": rng.integers(1000, 20000, (batch, seq)).astype(np.int32),
        "input_mask": np.ones((batch, seq), np.int32), "segment_ids": np.zeros((batch, seq), np.int32),
        "label_ids": rng.integers(0, 2, batch).astype(np.int32), "is_real_example": np.ones(batch, np.int32),
        "dropout_seed": np.array([1, 2], np.int64)}


def run(k, **kw):
    s, sg = steps[k]
    feed = {sg.inputs[n].name: v for n, v in vals.items() if n in sg.inputs}
    fetch = [o.name for n, o in sorted(sg.outputs.items())]
    return s.run(fetch, feed, **kw)


for k in steps:
    run(k)  # warm-up: Grappler, the rewrite, the first allocations
times = collections.defaultdict(list)
for r in range(rounds):
    for k in steps:
        t = time.perf_counter()
        run(k)
        times[k].append(time.perf_counter() - t)
for k in steps:
    print(f"{k}: median {np.median(times[k]):.3f} s over {rounds} rounds (min {min(times[k]):.3f})")
base = np.median(times["train_step"])
for k in list(steps)[1:]:
    if k.startswith("train_step"):
        print(f"  float32 / {k}: {base / np.median(times[k]):.2f}x")
for k in steps:
    if k.startswith(BASELINE):
        this = k[len(BASELINE):]
        print(f"  {k} / {this}: {np.median(times[k]) / np.median(times[this]):.3f}x")
for k in steps:
    if k.startswith(BASELINE):
        continue
    md = config_pb2.RunMetadata()
    run(k, options=config_pb2.RunOptions(trace_level=config_pb2.RunOptions.FULL_TRACE), run_metadata=md)
    per = collections.Counter()
    for dev in md.step_stats.dev_stats:
        for n in dev.node_stats:
            op = n.timeline_label.split("(")[0].split("= ")[-1].strip() if n.timeline_label else n.node_name
            per[op] += n.all_end_rel_micros / 1e6
    total = sum(per.values())
    print(f"{k}: traced ops total {total:.3f} s; top:")
    for op, sec in per.most_common(10):
        print(f"  {op:28s} {sec:.3f} s")
