"""Horovod's side of `make bench-peer`'s fine-tuning rows: the exporter's model trained under Horovod.

Run under mpirun with the peer virtualenv (Horovod built with MPI, TensorFlow):

    mpirun -np 2 .cache/peer/venv-.../bin/python scripts/bench_peer/horovod_finetune.py \
        --saved_model DIR --init_checkpoint CKPT --records R0 [R1 ...] --batch_size 16 --steps 4

Every rank builds the exporter's BERT classifier (bertgraph/exporter: the bert_config.json and
label count of the training SavedModel DIR, the graph gorovod's finetune runs), loads the weights
from CKPT (the checkpoint that SavedModel was exported from), and trains on the records of its
rank (the train.tf_record shards gorovod's finetune wrote for the same ranks): one step in a
tf.function is forward and backward with dropout, hvd.DistributedGradientTape(sparse_as_dense=True)
averaging the gradients, and AdamWeightDecay with global-norm clipping at 1.0, as the exporter's
train step and gorovod's apply_gradients. 1 intra-op and 1 inter-op thread per rank. Then it times
hvd.broadcast_variables of the model's variables from rank 0. Rank 0 prints one JSON line:
examples_per_sec over all ranks for the steps after the first, and broadcast_variables_sec (the
best of --broadcast_repeats calls, the slowest rank).
"""
import argparse
import json
import os
import pathlib
import sys
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import tensorflow as tf  # noqa: E402
import horovod.tensorflow as hvd  # noqa: E402

HERE = pathlib.Path(__file__).resolve().parent
sys.path[:0] = [str(HERE.parents[1]), str(HERE.parent)]
from bertgraph.exporter import checkpoint, contract  # noqa: E402
from bertgraph.exporter.config import BertConfig  # noqa: E402
from bench_mwms import training  # noqa: E402


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--saved_model", required=True, help="gorovod training SavedModel (its contract)")
    p.add_argument("--init_checkpoint", required=True, help="the checkpoint its weights came from")
    p.add_argument("--records", nargs="+", required=True, help="one train.tf_record per rank")
    p.add_argument("--batch_size", type=int, required=True, help="per rank")
    p.add_argument("--steps", type=int, default=4, help="timed steps after the first")
    p.add_argument("--broadcast_repeats", type=int, default=5)
    a = p.parse_args()

    tf.config.threading.set_intra_op_parallelism_threads(1)
    tf.config.threading.set_inter_op_parallelism_threads(1)
    hvd.init()
    if hvd.size() != len(a.records):
        sys.exit(f"horovod_finetune.py: {hvd.size()} ranks, {len(a.records)} --records files")

    meta = contract.read(a.saved_model)
    config = BertConfig.from_dict(meta["bert_config"])
    seq = meta["max_seq_length"]
    model, global_step, optimizer, variables, parse = training(tf, config, meta["num_labels"], seq)
    if not model.load_values(checkpoint.read(a.init_checkpoint)):
        sys.exit(f"horovod_finetune.py: {a.init_checkpoint}: no variable of the model in it")

    ds = tf.data.TFRecordDataset(a.records[hvd.rank()]).repeat().map(parse)
    batches = iter(ds.batch(a.batch_size, drop_remainder=True).prefetch(2))

    @tf.function
    def train_step(batch):
        seed = tf.stack([tf.constant(hvd.rank(), tf.int64), global_step])
        with tf.GradientTape() as tape:
            logits = model.logits(batch["input_ids"], batch["input_mask"], batch["segment_ids"], seed)
            loss = tf.reduce_mean(tf.nn.sparse_softmax_cross_entropy_with_logits(
                labels=batch["label_ids"], logits=logits))
        tape = hvd.DistributedGradientTape(tape, sparse_as_dense=True)
        grads = tape.gradient(loss, variables)
        optimizer.apply(grads, 1e-5, 1.0, global_step)
        return loss

    train_step(next(batches)).numpy()
    start = time.perf_counter()
    for _ in range(a.steps):
        loss = train_step(next(batches)).numpy()
    elapsed = time.perf_counter() - start

    hvd.broadcast_variables(variables, root_rank=0)  # warm-up: traces Horovod's broadcast group
    best = float("inf")
    for _ in range(a.broadcast_repeats):
        hvd.allreduce(tf.zeros([1]), op=hvd.Sum, name="bench.barrier")
        t = time.perf_counter()
        hvd.broadcast_variables(variables, root_rank=0)
        best = min(best, time.perf_counter() - t)
    slowest = float(hvd.allreduce(tf.constant([best], tf.float64), op=hvd.Max, name="bench.time").numpy()[0])

    if hvd.rank() == 0:
        print(json.dumps({"examples_per_sec": a.steps * a.batch_size * hvd.size() / elapsed,
                          "ranks": hvd.size(), "batch_size_per_rank": a.batch_size, "steps": a.steps,
                          "seconds": elapsed, "final_loss": float(loss),
                          "broadcast_variables_sec": slowest, "variables": len(variables),
                          "variable_bytes": sum(v.shape.num_elements() * 4 for v in variables)}), flush=True)
    hvd.shutdown()


if __name__ == "__main__":
    main()
