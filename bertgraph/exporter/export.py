"""Exports the training SavedModel (with a serving SavedModel packaged inside it).

    python -m bertgraph.exporter.export --bert_config bert_config.json --vocab vocab.txt \
        [--init_checkpoint bert_model.ckpt] --num_labels 2 --max_seq_length 128 --out DIR

Layout of DIR:
    saved_model.pb, variables/                 the training SavedModel (signatures in contract.py)
    assets.extra/gorovod_contract.json         the contract Go validates
    assets.extra/serving/                      serving-only SavedModel (serving_default), same
                                               checkpoint keys for the model variables, no optimizer
    assets.extra/vocab.txt, bert_config.json   copied for the Classifier and for reference
The serving SavedModel has the same assets.extra files, its contract of kind "serving".

Training checkpoints are not the SavedModel's object-based ones: the save_checkpoint and
restore_checkpoint signatures write and read every training variable under its Google name, as
Google BERT's run_classifier names them (``training_state``), so run_classifier, extract_features
and Hugging Face's converter read what Go writes, and a run_classifier checkpoint resumes here.
"""
import argparse
import os
import pathlib
import re
import shutil
import signal
import sys
import tempfile

import tensorflow as tf

from . import checkpoint, contract, outdir
from .config import TINY, BertConfig
from .model import BertClassifier, object_key
from .optimizer import (BETA_1, BETA_2, EPSILON, EXCLUDE_FROM_WEIGHT_DECAY,
                        INITIAL_LOSS_SCALE, LOSS_SCALE_GROWTH_INTERVAL, WEIGHT_DECAY_RATE,
                        AdamWeightDecay, LossScale, uses_weight_decay)


def _batch_specs(max_seq_length, labels=True):
    specs = {
        "input_ids": tf.TensorSpec([None, max_seq_length], tf.int32, "input_ids"),
        "input_mask": tf.TensorSpec([None, max_seq_length], tf.int32, "input_mask"),
        "segment_ids": tf.TensorSpec([None, max_seq_length], tf.int32, "segment_ids"),
    }
    if labels:
        specs["label_ids"] = tf.TensorSpec([None], tf.int32, "label_ids")
        specs["is_real_example"] = tf.TensorSpec([None], tf.int32, "is_real_example")
    return specs


class Signature:
    """A concrete function whose signature inputs are named by ``specs``' keys."""

    def __init__(self, fn, specs):
        self.specs = specs
        self.function = tf.function(fn).get_concrete_function(**specs)

    def entry(self):
        return contract.signature_entry(self.function, self.specs)


def _classification(model, batch, dropout_seed, compute_dtype=tf.float32):
    logits = model.logits(batch["input_ids"], batch["input_mask"], batch["segment_ids"],
                          dropout_seed, compute_dtype)
    labels = batch["label_ids"]
    log_probs = tf.nn.log_softmax(logits)
    per_example_loss = -tf.reduce_sum(tf.one_hot(labels, model.num_labels) * log_probs, axis=-1)
    real = tf.cast(batch["is_real_example"], tf.float32)
    hits = tf.cast(tf.equal(tf.argmax(logits, axis=-1, output_type=tf.int32), labels), tf.float32)
    loss_sum = tf.reduce_sum(per_example_loss * real)
    correct = tf.cast(tf.reduce_sum(hits * real), tf.int32)
    examples = tf.cast(tf.reduce_sum(real), tf.int32)
    return loss_sum, correct, examples


def training_state(model):
    """(name, variable) of everything a training checkpoint holds, named as Google BERT's
    run_classifier names it: the model variables, their AdamWeightDecayOptimizer slots
    ``<name>/adam_m`` and ``<name>/adam_v``, and ``global_step``."""
    return list(model.named_variables) + model.optimizer.named_slots + \
        [("global_step", model.global_step)]


def _full_slice(shape):
    """RestoreV2's shape_and_slice for all of a tensor of ``shape``: "<dims> -:-...".  Given the
    full shape, RestoreV2 refuses a stored tensor of another shape, naming it ("tensor_name = ...;
    shape in shape_and_slice spec ... does not match"), and its outputs get static shapes."""
    dims = shape.as_list()
    return " ".join([str(d) for d in dims] + [":".join("-" * len(dims))]) if dims else ""


def _restore(prefix, state):
    """Reads every (name, variable) of ``state`` from the checkpoint ``prefix`` and assigns it.
    One RestoreV2 reads all the values, checking each stored name, dtype and shape against the
    variable's (its error names the tensor), before any assignment: a checkpoint that does not fit
    changes nothing.  A scalar's slice spec carries no shape: each value's shape is checked again,
    by an op named after its tensor, and every assignment waits for all the checks, so that a
    stored global_step of another shape is refused before anything is assigned too."""
    values = tf.raw_ops.RestoreV2(prefix=prefix, tensor_names=[n for n, _ in state],
                                  shape_and_slices=[_full_slice(v.shape) for _, v in state],
                                  dtypes=[v.dtype for _, v in state])
    checked = [tf.ensure_shape(value, var.shape, name=f"restore_{name.replace('/', '_')}")
               for (name, var), value in zip(state, values)]
    with tf.control_dependencies(checked):
        return [var.assign(tf.identity(value), read_value=False) for (_, var), value in zip(state, checked)]


def build(config, num_labels, max_seq_length, dropout=True, seed=0):
    """Returns (root module, {signature key: Signature})."""
    if max_seq_length > config.max_position_embeddings:
        raise ValueError(f"max_seq_length {max_seq_length} exceeds max_position_embeddings "
                         f"{config.max_position_embeddings}")
    model = BertClassifier(config, num_labels, seed=seed)
    model.global_step = tf.Variable(0, dtype=tf.int64, trainable=False, name="global_step")
    model.optimizer = AdamWeightDecay(model.named_variables)
    model.loss_scale = LossScale()
    names = [n for n, _ in model.named_variables]
    variables = [v for _, v in model.named_variables]
    grad_keys = [contract.gradient_key(i) for i in range(len(names))]
    var_keys = [contract.variable_key(i) for i in range(len(names))]
    batch = _batch_specs(max_seq_length)
    features = _batch_specs(max_seq_length, labels=False)

    def train_step_in(compute_dtype):
        def train_step(input_ids, input_mask, segment_ids, label_ids, is_real_example,
                       dropout_seed):
            b = dict(input_ids=input_ids, input_mask=input_mask, segment_ids=segment_ids,
                     label_ids=label_ids, is_real_example=is_real_example)
            with tf.GradientTape() as tape:
                loss_sum, correct, examples = _classification(
                    model, b, dropout_seed if dropout else None, compute_dtype)
                loss = tf.math.divide_no_nan(loss_sum, tf.cast(examples, tf.float32))
                scaled = loss * model.loss_scale.loss_scale.read_value()
            grads = tape.gradient(scaled, variables,
                                  unconnected_gradients=tf.UnconnectedGradients.ZERO)
            out = {"loss": loss, "correct": correct, "examples": examples}
            # sparse_as_dense: the word-embedding gradient arrives as IndexedSlices.
            out.update({k: tf.convert_to_tensor(g) for k, g in zip(grad_keys, grads)})
            return out
        return train_step

    def apply_gradients(gradient_scale, learning_rate, clip_norm, **grads):
        global_norm, applied = model.optimizer.apply(
            [grads[k] for k in grad_keys], learning_rate, clip_norm, model.global_step,
            gradient_scale, model.loss_scale)
        return {"global_norm": global_norm, "applied": applied,
                "global_step": model.global_step.read_value(),
                "loss_scale": model.loss_scale.loss_scale.read_value()}

    def set_loss_scale(loss_scale, growth_interval):
        model.loss_scale.set(loss_scale, growth_interval)
        return {"loss_scale": model.loss_scale.loss_scale.read_value()}

    def eval_step(input_ids, input_mask, segment_ids, label_ids, is_real_example):
        loss_sum, correct, examples = _classification(
            model, dict(input_ids=input_ids, input_mask=input_mask, segment_ids=segment_ids,
                        label_ids=label_ids, is_real_example=is_real_example), None)
        return {"loss_sum": loss_sum, "correct": correct, "examples": examples}

    def predict(input_ids, input_mask, segment_ids):
        return _predictions(model, input_ids, input_mask, segment_ids)

    state = training_state(model)

    def save_checkpoint(prefix):
        names = [n for n, _ in state]
        saved = tf.raw_ops.SaveV2(prefix=prefix, tensor_names=names,
                                  shape_and_slices=[""] * len(names),
                                  tensors=[v.read_value() for _, v in state])
        with tf.control_dependencies([saved]):
            return {"prefix": tf.identity(prefix)}

    def restore_checkpoint(prefix):
        with tf.control_dependencies(_restore(prefix, state)):
            return {"global_step": model.global_step.read_value()}

    def read_variables():
        out = {k: v.read_value() for k, v in zip(var_keys, variables)}
        out["global_step"] = model.global_step.read_value()
        return out

    def assign_variables(**values):
        for k, v in zip(var_keys, variables):
            v.assign(values[k])
        return {"num_assigned": tf.constant(len(variables), tf.int32)}

    grad_specs = {k: tf.TensorSpec(v.shape, tf.float32, k) for k, v in zip(grad_keys, variables)}
    var_specs = {k: tf.TensorSpec(v.shape, tf.float32, k) for k, v in zip(var_keys, variables)}
    scalar = tf.TensorSpec([], tf.float32)
    prefix = {"prefix": tf.TensorSpec([], tf.string, "prefix")}
    predict_fn = Signature(predict, features)
    train_specs = dict(batch, dropout_seed=tf.TensorSpec([2], tf.int64, "dropout_seed"))
    signatures = {
        contract.TRAIN_STEP: Signature(train_step_in(tf.float32), train_specs),
        contract.APPLY_GRADIENTS: Signature(
            apply_gradients, dict(grad_specs, gradient_scale=scalar, learning_rate=scalar,
                                  clip_norm=scalar)),
        contract.EVAL_STEP: Signature(eval_step, batch),
        contract.PREDICT: predict_fn,
        contract.SERVING_DEFAULT: predict_fn,
        contract.READ_VARIABLES: Signature(read_variables, {}),
        contract.ASSIGN_VARIABLES: Signature(assign_variables, var_specs),
        contract.SAVE_CHECKPOINT: Signature(save_checkpoint, prefix),
        contract.RESTORE_CHECKPOINT: Signature(restore_checkpoint, prefix),
        contract.SET_LOSS_SCALE: Signature(set_loss_scale, {
            "loss_scale": tf.TensorSpec([], tf.float32, "loss_scale"),
            "growth_interval": tf.TensorSpec([], tf.int64, "growth_interval")}),
    }
    for dtype, key in contract.MIXED_TRAIN_STEPS.items():
        signatures[key] = Signature(train_step_in(tf.as_dtype(dtype)), train_specs)
    return model, signatures


def _predictions(model, input_ids, input_mask, segment_ids):
    logits = model.logits(input_ids, input_mask, segment_ids)
    return {"probabilities": tf.nn.softmax(logits), "logits": logits}


def _build_serving(model, max_seq_length):
    """A serving-only twin of ``model``: same variable tree (same checkpoint keys), no optimizer."""
    serving = BertClassifier(model.config, model.num_labels)
    serving.load_values({n: v.numpy() for n, v in model.named_variables})
    fn = Signature(lambda **features: _predictions(serving, **features),
                          _batch_specs(max_seq_length, labels=False))
    return serving, {contract.SERVING_DEFAULT: fn}


def _model_entry(model, max_seq_length, label_names, do_lower_case):
    """The part of the contract a Classifier needs: what the model reads and what it predicts."""
    return {
        "contract_version": contract.CONTRACT_VERSION,
        "bert_config": model.config.to_dict(),
        "num_labels": model.num_labels,
        "label_names": list(label_names) if label_names else
        [str(i) for i in range(model.num_labels)],
        "max_seq_length": max_seq_length,
        "do_lower_case": do_lower_case,
        "vocab_file": contract.VOCAB_FILE,
    }


def make_serving_contract(model, signatures, max_seq_length, label_names, do_lower_case):
    return dict(
        _model_entry(model, max_seq_length, label_names, do_lower_case),
        kind="serving",
        signatures={k: s.entry() for k, s in sorted(signatures.items())},
        variables=[{"name": name, "shape": var.shape.as_list(), "dtype": var.dtype.name,
                    "object_key": object_key(name)} for name, var in model.named_variables])


def make_contract(model, signatures, max_seq_length, dropout, label_names, do_lower_case):
    variables = []
    for i, (name, var) in enumerate(model.named_variables):
        variables.append({
            "name": name,
            "shape": var.shape.as_list(),
            "dtype": var.dtype.name,
            "gradient_key": contract.gradient_key(i),
            "value_key": contract.variable_key(i),
            "checkpoint_key": name,
            "object_key": object_key(name),
            "weight_decay": uses_weight_decay(name),
        })
    slots = [{"name": name, "checkpoint_key": name, "shape": var.shape.as_list(),
              "dtype": var.dtype.name} for name, var in model.optimizer.named_slots]
    return dict(
        _model_entry(model, max_seq_length, label_names, do_lower_case),
        kind="training",
        dropout=dropout,
        signatures={k: s.entry() for k, s in sorted(signatures.items())},
        variables=variables,
        global_step={"name": "global_step", "checkpoint_key": "global_step", "dtype": "int64"},
        optimizer={
            "name": "AdamWeightDecay", "beta_1": BETA_1, "beta_2": BETA_2, "epsilon": EPSILON,
            "weight_decay_rate": WEIGHT_DECAY_RATE,
            "exclude_from_weight_decay": list(EXCLUDE_FROM_WEIGHT_DECAY),
            "clip": "global_norm", "default_clip_norm": 1.0, "slots": slots,
        },
        loss_scale={
            "initial": INITIAL_LOSS_SCALE, "growth_interval": LOSS_SCALE_GROWTH_INTERVAL,
            "note": "float16 compute only; not in training checkpoints (a resumed run starts "
                    "again from the initial scale)",
        },
        checkpoint_key_mapping=(
            "save_checkpoint writes, and restore_checkpoint reads, every training variable under "
            "its Google BERT name, as run_classifier's checkpoints have them: a model variable N "
            "under N, its AdamWeightDecayOptimizer slots under N/adam_m and N/adam_v, and "
            "global_step (int64) under global_step.  object_key is a model variable's key in the "
            "SavedModel's own variables/ (and in training checkpoints of contract version 2 "
            "and older): N/.ATTRIBUTES/VARIABLE_VALUE."),
        serving_dir=contract.SERVING_DIR,
    )


def check_vocab(vocab_file, config):
    """Refuses a vocabulary the model cannot embed or finetune would refuse (Go's checks)."""
    try:
        tokens = [t.strip() for t in pathlib.Path(vocab_file).read_text(encoding="utf-8").splitlines()]
    except (OSError, UnicodeDecodeError) as e:
        raise ValueError(f"--vocab {vocab_file}: {e}") from e
    if len(tokens) > config.vocab_size:
        raise ValueError(f"--vocab {vocab_file} has {len(tokens)} tokens but the model embeds only "
                         f"vocab_size {config.vocab_size}: ids from {config.vocab_size} on would "
                         "index past the embedding table")
    for special in ("[CLS]", "[SEP]", "[UNK]"):
        if special not in tokens:
            raise ValueError(f"--vocab {vocab_file} has no {special} token")


def export(out_dir, config, num_labels, max_seq_length, vocab_file, init_checkpoint=None,
           dropout=True, seed=0, label_names=None, do_lower_case=True, log=print):
    """Writes the training SavedModel (and its serving model) to ``out_dir``, atomically: a
    previous export there is replaced, anything else refused (outdir.check)."""
    out_dir = pathlib.Path(out_dir)
    outdir.check(out_dir, contract.CONTRACT_FILE, "an export")
    check_vocab(vocab_file, config)
    if label_names and len(label_names) != num_labels:
        raise ValueError(f"{len(label_names)} label names for {num_labels} labels")
    if label_names and (any(not n for n in label_names) or len(set(label_names)) != len(label_names)):
        raise ValueError(f"label names {label_names}: each must be non-empty and distinct")
    if max_seq_length < 3:
        raise ValueError(f"max_seq_length {max_seq_length}: want at least 3 ([CLS], a token, [SEP])")
    model, signatures = build(config, num_labels, max_seq_length, dropout=dropout, seed=seed)
    if init_checkpoint:
        # A checkpoint's .index or .data file names its prefix, as in finetune.
        prefix = re.sub(r"\.(index|data-\d+-of-\d+)$", "", str(init_checkpoint))
        try:
            values = checkpoint.read(prefix)
        except (tf.errors.NotFoundError, tf.errors.DataLossError) as e:  # no checkpoint, or a damaged one
            raise ValueError(f"--init_checkpoint {init_checkpoint}: cannot read a checkpoint at {prefix}: "
                             f"{e.message.splitlines()[0]}") from e
        assigned = set(model.load_values(values))
        if not any(n.startswith("bert/") for n in assigned):
            raise ValueError(f"--init_checkpoint {init_checkpoint} initialises none of the model's "
                             f"BERT variables: it holds {len(values)} tensors, e.g. "
                             f"{sorted(values)[:3]} (a Google-format checkpoint names them "
                             "bert/embeddings/..., bert/encoder/layer_N/...)")
        for name, var in model.named_variables:
            log(f"  name = {name}, shape = {var.shape}"
                + (", *INIT_FROM_CKPT*" if name in assigned else ""))
    serving, serving_signatures = _build_serving(model, max_seq_length)
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    staging = pathlib.Path(tempfile.mkdtemp(prefix=out_dir.name + ".", dir=out_dir.parent))
    try:
        tf.saved_model.save(model, str(staging),
                            signatures={k: s.function for k, s in signatures.items()})
        serving_dir = staging / contract.SERVING_DIR
        tf.saved_model.save(serving, str(serving_dir),
                            signatures={k: s.function for k, s in serving_signatures.items()})
        contract.write(staging, make_contract(model, signatures, max_seq_length, dropout,
                                              label_names, do_lower_case))
        contract.write(serving_dir, make_serving_contract(
            serving, serving_signatures, max_seq_length, label_names, do_lower_case))
        for d in (staging, serving_dir):
            config.to_json_file(d / "assets.extra/bert_config.json")
            shutil.copyfile(vocab_file, d / contract.VOCAB_FILE)
        # mkdtemp's 0700 would keep the model from every other user (ranks or servers run as
        # another user, a shared directory): the mode a plain mkdir gives.
        umask = os.umask(0)
        os.umask(umask)
        staging.chmod(0o777 & ~umask)
        outdir.replace(staging, out_dir)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return out_dir


def export_tiny(out_dir, num_labels=2, max_seq_length=32, **kwargs):
    """The tiny configuration with a generated vocabulary (tests and quick runs)."""
    with tempfile.TemporaryDirectory() as tmp:
        vocab = pathlib.Path(tmp) / "vocab.txt"
        write_tiny_vocab(vocab, TINY.vocab_size)
        return export(out_dir, TINY, num_labels, max_seq_length, vocab, **kwargs)


def write_tiny_vocab(path, size):
    """A vocab of ``size`` entries: the BERT specials, then ASCII words ``w0 w1 ...``."""
    specials = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
    words = [f"w{i}" for i in range(size - len(specials))]
    pathlib.Path(path).write_text("\n".join(specials + words) + "\n")


def _boolean(s):
    """absl's booleans: true/false, 1/0, yes/no (any case); anything else is refused."""
    v = {"true": True, "1": True, "yes": True, "false": False, "0": False, "no": False}.get(s.lower())
    if v is None:
        raise argparse.ArgumentTypeError(f"{s!r} is not a boolean (true or false)")
    return v


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--bert_config", help="Google bert_config.json")
    p.add_argument("--tiny", action="store_true",
                   help="use the tiny test configuration (2 layers, hidden 32) and a generated vocab")
    p.add_argument("--vocab", help="vocab.txt, copied into assets.extra (required unless --tiny)")
    p.add_argument("--do_lower_case", type=_boolean, default=True,
                   help="whether the vocab is uncased (default true)")
    p.add_argument("--init_checkpoint", help="Google-format checkpoint to start from")
    p.add_argument("--num_labels", type=int, default=2)
    p.add_argument("--label_names", help="comma-separated label names (default 0..num_labels-1)")
    p.add_argument("--max_seq_length", type=int, default=128)
    p.add_argument("--no_dropout", action="store_true",
                   help="train_step without dropout (exact-equivalence tests)")
    p.add_argument("--seed", type=int, default=0, help="seed of the initial weights")
    p.add_argument("--out", required=True)
    a = p.parse_args(argv)
    if a.tiny == bool(a.bert_config):
        p.error("give exactly one of --bert_config and --tiny")
    if not a.tiny and not a.vocab:
        p.error("--vocab is required with --bert_config")
    if a.tiny and a.vocab:
        p.error("--tiny generates its vocab: --vocab goes with --bert_config")
    # A kill (timeout, a scheduler) ends the export through its cleanup, as Ctrl-C does: no
    # staging directory is left beside --out.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(128 + signal.SIGTERM))
    kwargs = dict(init_checkpoint=a.init_checkpoint, dropout=not a.no_dropout, seed=a.seed,
                  label_names=a.label_names.split(",") if a.label_names else None,
                  do_lower_case=a.do_lower_case, log=lambda s: print(s, file=sys.stderr))
    try:
        if a.tiny:
            export_tiny(a.out, a.num_labels, a.max_seq_length, **kwargs)
        else:
            export(a.out, BertConfig.from_json_file(a.bert_config), a.num_labels, a.max_seq_length,
                   a.vocab, **kwargs)
    except ValueError as e:  # bad input, said without a traceback
        print(f"export: {e}", file=sys.stderr)
        sys.exit(1)
    print(a.out)


if __name__ == "__main__":
    main()
