"""Training throughput of TensorFlow's own multi-worker data parallelism on the gorovod model.

    python scripts/bench_mwms.py --saved_model DIR --records R0 [R1 ...] --batch_size B \
        --steps N [--warmup W] [--threads T]

Starts one worker process per --records file with MultiWorkerMirroredStrategy (TF_CONFIG, gRPC
on localhost, ring collectives), each training the exporter's BERT classifier (the same
bert_config.json and label count as the training SavedModel DIR) on its file of
run_classifier records: the train.tf_record shards that gorovod's finetune wrote for the same
ranks, so both read the same examples. One step = forward and backward with dropout, gradients
densified and all-reduced (mean) across workers, then AdamWeightDecay with global-norm
clipping: the same work as gorovod's train_step + allreduce + apply_gradients with
--sparse_as_dense (by default gorovod allgathers the word embeddings' looked-up rows instead). Prints one JSON line: {"examples_per_sec": ..., "workers": ..., ...}, the rate
of the steps after the warmup, all workers together.
"""
import argparse
import json
import os
import pathlib
import socket
import subprocess
import sys
import time

ROOT = pathlib.Path(__file__).resolve().parent.parent


def free_ports(n):
    socks = [socket.socket() for _ in range(n)]
    for s in socks:
        s.bind(("localhost", 0))
    ports = [s.getsockname()[1] for s in socks]
    for s in socks:
        s.close()
    return ports


def training(tf, config, num_labels, seq):
    """The exporter's classifier for ``config`` with its global step, optimizer and variables, and
    a parser of run_classifier's records of ``seq`` tokens into int32 features."""
    from bertgraph.exporter.model import BertClassifier
    from bertgraph.exporter.optimizer import AdamWeightDecay

    model = BertClassifier(config, num_labels)
    global_step = tf.Variable(0, dtype=tf.int64, trainable=False, name="global_step")
    optimizer = AdamWeightDecay(model.named_variables)
    variables = [v for _, v in model.named_variables]
    spec = {k: tf.io.FixedLenFeature([seq], tf.int64) for k in ("input_ids", "input_mask", "segment_ids")}
    spec["label_ids"] = tf.io.FixedLenFeature([], tf.int64)

    def parse(record):
        ex = tf.io.parse_single_example(record, spec)
        return {k: tf.cast(v, tf.int32) for k, v in ex.items()}

    return model, global_step, optimizer, variables, parse


def worker(a):
    import tensorflow as tf
    tf.config.threading.set_intra_op_parallelism_threads(a.threads)
    tf.config.threading.set_inter_op_parallelism_threads(a.inter_op_threads)
    sys.path.insert(0, str(ROOT))
    from bertgraph.exporter import contract
    from bertgraph.exporter.config import BertConfig

    meta = contract.read(a.saved_model)
    config = BertConfig.from_dict(meta["bert_config"])
    num_labels, seq = meta["num_labels"], meta["max_seq_length"]
    index = json.loads(os.environ["TF_CONFIG"])["task"]["index"]

    strategy = tf.distribute.MultiWorkerMirroredStrategy(
        communication_options=tf.distribute.experimental.CommunicationOptions(
            implementation=tf.distribute.experimental.CommunicationImplementation.RING))

    # Horovod's layout: every worker keeps its own copy of the variables (same seeded initial
    # values), the strategy all-reduces the gradients, and each worker applies the same update.
    model, global_step, optimizer, variables, parse = training(tf, config, num_labels, seq)

    def dataset_fn(ctx):
        # Worker i reads the records gorovod's rank i trained on.
        ds = tf.data.TFRecordDataset(a.records[ctx.input_pipeline_id]).repeat()
        return ds.map(parse).batch(a.batch_size, drop_remainder=True).prefetch(2)

    options = tf.distribute.InputOptions(experimental_fetch_to_device=False)
    it = iter(strategy.distribute_datasets_from_function(dataset_fn, options))

    @tf.function
    def train_step(iterator):
        def step(batch):
            ctx = tf.distribute.get_replica_context()
            seed = tf.stack([tf.cast(ctx.replica_id_in_sync_group, tf.int64), global_step])
            with tf.GradientTape() as tape:
                logits = model.logits(batch["input_ids"], batch["input_mask"], batch["segment_ids"], seed)
                loss = tf.reduce_mean(tf.nn.sparse_softmax_cross_entropy_with_logits(
                    labels=batch["label_ids"], logits=logits))
            grads = [tf.convert_to_tensor(g) for g in tape.gradient(loss, variables)]
            grads = ctx.all_reduce(tf.distribute.ReduceOp.MEAN, grads)
            optimizer.apply(grads, 1e-5, 1.0, global_step)
            return loss
        return strategy.reduce(tf.distribute.ReduceOp.MEAN, strategy.run(step, args=(next(iterator),)),
                               axis=None)

    if strategy.num_replicas_in_sync != len(a.records):
        sys.exit(f"bench_mwms: {strategy.num_replicas_in_sync} replicas in sync, want {len(a.records)}")
    for _ in range(a.warmup):
        train_step(it).numpy()
    start = time.perf_counter()
    for _ in range(a.steps):
        loss = train_step(it).numpy()
    elapsed = time.perf_counter() - start
    if index == 0:
        workers = len(a.records)
        print(json.dumps({"examples_per_sec": a.steps * a.batch_size * workers / elapsed,
                          "workers": workers, "batch_size_per_worker": a.batch_size,
                          "steps": a.steps, "seconds": elapsed, "final_loss": float(loss),
                          "threads": a.threads}), flush=True)


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--saved_model", required=True, help="gorovod training SavedModel (its contract)")
    p.add_argument("--records", nargs="+", required=True, help="one train.tf_record per worker")
    p.add_argument("--batch_size", type=int, required=True, help="per worker")
    p.add_argument("--steps", type=int, default=10)
    p.add_argument("--warmup", type=int, default=1)
    p.add_argument("--threads", type=int, default=1, help="intra-op threads per worker")
    p.add_argument("--inter_op_threads", type=int, default=1)
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    a = p.parse_args()
    if a.worker:
        worker(a)
        return
    ports = free_ports(len(a.records))
    cluster = {"worker": [f"localhost:{port}" for port in ports]}
    procs = []
    for i in range(len(a.records)):
        env = dict(os.environ, TF_CONFIG=json.dumps({"cluster": cluster, "task": {"type": "worker", "index": i}}),
                   TF_CPP_MIN_LOG_LEVEL="2", CUDA_VISIBLE_DEVICES="")
        procs.append(subprocess.Popen([sys.executable, __file__, "--worker"] + sys.argv[1:], env=env))
    codes = [proc.wait() for proc in procs]
    if any(codes):
        sys.exit(f"bench_mwms: worker exit codes {codes}")


if __name__ == "__main__":
    main()
