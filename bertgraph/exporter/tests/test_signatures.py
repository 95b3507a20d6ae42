"""The training SavedModel's signatures, driven from Python, against independent references:
finite differences for train_step's gradients, a numpy AdamWeightDecay for apply_gradients, the
predictions for eval_step."""
import json

import numpy as np
import pytest
import tensorflow as tf

from bertgraph.exporter import contract, export
from bertgraph.exporter.config import TINY
from bertgraph.exporter.model import object_key
from bertgraph.exporter.optimizer import uses_weight_decay

SEQ = 16
LABELS = 3


def _export(tmp, dropout):
    return export.export_tiny(tmp, LABELS, SEQ, dropout=dropout, seed=3, log=lambda s: None)


@pytest.fixture(scope="module")
def dropout_on(tmp_path_factory):
    return _export(tmp_path_factory.mktemp("on") / "model", True)


@pytest.fixture(scope="module")
def dropout_off(tmp_path_factory):
    return _export(tmp_path_factory.mktemp("off") / "model", False)


def _batch(n=6, seed=0):
    rng = np.random.default_rng(seed)
    ids = rng.integers(5, TINY.vocab_size, size=(n, SEQ)).astype(np.int32)
    lengths = rng.integers(4, SEQ + 1, size=n)
    mask = (np.arange(SEQ)[None] < lengths[:, None]).astype(np.int32)
    ids *= mask
    segments = ((np.arange(SEQ)[None] >= lengths[:, None] // 2) * mask).astype(np.int32)
    return {"input_ids": tf.constant(ids), "input_mask": tf.constant(mask),
            "segment_ids": tf.constant(segments),
            "label_ids": tf.constant(rng.integers(0, LABELS, size=n).astype(np.int32)),
            "is_real_example": tf.constant(np.ones(n, np.int32))}


def _features(batch):
    return {k: batch[k] for k in ("input_ids", "input_mask", "segment_ids")}


def _variables(loaded, contract_):
    out = loaded.signatures["read_variables"]()
    return [out[v["value_key"]].numpy() for v in contract_["variables"]]


def _assign(loaded, contract_, values):
    loaded.signatures["assign_variables"](**{
        v["value_key"]: tf.constant(x) for v, x in zip(contract_["variables"], values)})


def test_export_directory_has_mkdirs_mode(dropout_on, tmp_path):
    """The export is readable as a directory made with mkdir is, not only by its owner."""
    (tmp_path / "plain").mkdir()
    assert (dropout_on.stat().st_mode & 0o777) == ((tmp_path / "plain").stat().st_mode & 0o777)


def test_contract_describes_the_saved_model(dropout_on):
    c = contract.read(dropout_on)
    assert c["contract_version"] == contract.CONTRACT_VERSION
    loaded = tf.saved_model.load(str(dropout_on))
    names = [v["name"] for v in c["variables"]]
    assert names[0] == "bert/embeddings/word_embeddings"
    assert names[-2:] == ["output_weights", "output_bias"]
    assert len(names) == 5 + 16 * TINY.num_hidden_layers + 4
    train_outputs = c["signatures"]["train_step"]["outputs"]
    assert sorted(k for k in train_outputs if k.startswith("grad_")) == \
        [v["gradient_key"] for v in c["variables"]]
    for v in c["variables"]:
        assert train_outputs[v["gradient_key"]]["shape"] == v["shape"]
        assert v["weight_decay"] == ("LayerNorm" not in v["name"] and "bias" not in v["name"])
    assert set(loaded.signatures) == set(c["signatures"])
    assert c["signatures"]["apply_gradients"]["inputs"]["gradient_scale"] == \
        {"dtype": "float32", "shape": []}
    for key, sig in c["signatures"].items():
        fn = loaded.signatures[key]
        assert set(fn.structured_outputs) == set(sig["outputs"]), key
    reader = tf.train.load_checkpoint(str(dropout_on / "variables/variables"))
    keys = set(reader.get_variable_to_shape_map())
    for v in c["variables"]:
        assert v["object_key"] in keys and v["object_key"] == object_key(v["name"])
        assert v["checkpoint_key"] == v["name"]
    # Training checkpoints use Google's names: <name>/adam_m, <name>/adam_v, global_step.
    assert [s["checkpoint_key"] for s in c["optimizer"]["slots"]] == \
        [f"{n}/{slot}" for slot in ("adam_m", "adam_v") for n in names]
    assert c["global_step"]["checkpoint_key"] == "global_step"
    for key in ("save_checkpoint", "restore_checkpoint"):
        assert c["signatures"][key]["inputs"] == {"prefix": {"dtype": "string", "shape": []}}
    assert json.loads((dropout_on / "assets.extra/bert_config.json").read_text()) == TINY.to_dict()


def test_gradients_match_finite_differences(dropout_off):
    c = contract.read(dropout_off)
    m = tf.saved_model.load(str(dropout_off))
    batch = _batch()
    seed = tf.constant([1, 2], tf.int64)
    out = m.signatures["train_step"](**batch, dropout_seed=seed)
    grads = [out[v["gradient_key"]].numpy() for v in c["variables"]]
    assert all(g.shape == tuple(v["shape"]) for g, v in zip(grads, c["variables"]))
    base = _variables(m, c)
    rng = np.random.default_rng(1)
    # Perturbations of 1e-3 keep the central difference in its linear range (weights ~0.02).
    direction = [rng.standard_normal(x.shape).astype(np.float32) * 0.01 for x in base]
    eps = 0.1

    def loss_at(t):
        _assign(m, c, [x + t * d for x, d in zip(base, direction)])
        e = m.signatures["eval_step"](**batch)
        return float(e["loss_sum"]) / int(e["examples"])

    numeric = (loss_at(eps) - loss_at(-eps)) / (2 * eps)
    analytic = sum(float(np.sum(g * d)) for g, d in zip(grads, direction))
    assert abs(numeric - analytic) < 1e-2 * abs(analytic), (numeric, analytic)
    assert abs(analytic) > 1e-3
    # The word-embedding gradient is dense and non-zero only on rows of ids in the batch.
    word = grads[0]
    used = np.unique(batch["input_ids"].numpy())
    assert np.abs(word[used]).sum() > 0
    assert np.abs(np.delete(word, used, axis=0)).max() == 0


def _numpy_adamw(params, grads, m, v, names, lr, clip):
    norm = np.sqrt(sum(float(np.sum(g.astype(np.float64) ** 2)) for g in grads))
    scale = clip / max(norm, clip)
    out_p, out_m, out_v = [], [], []
    for p, g, mm, vv, name in zip(params, grads, m, v, names):
        g = g * scale
        mm = 0.9 * mm + 0.1 * g
        vv = 0.999 * vv + 0.001 * g * g
        step = mm / (np.sqrt(vv) + 1e-6)
        if uses_weight_decay(name):
            step = step + 0.01 * p
        out_p.append(p - lr * step)
        out_m.append(mm)
        out_v.append(vv)
    return out_p, out_m, out_v, norm


def _slot(m, slot, name):
    node = getattr(m.optimizer, slot)
    for part in name.split("/"):
        node = getattr(node, part)
    return node.numpy()


def _apply(m, c, grads, gradient_scale, learning_rate=1e-2, clip_norm=1.0):
    return m.signatures["apply_gradients"](
        gradient_scale=tf.constant(gradient_scale, tf.float32),
        learning_rate=tf.constant(learning_rate, tf.float32),
        clip_norm=tf.constant(clip_norm, tf.float32),
        **{v["gradient_key"]: tf.constant(g) for v, g in zip(c["variables"], grads)})


def _state(m, c):
    """The weights, then the Adam slots, in gradient order."""
    names = [v["name"] for v in c["variables"]]
    return (_variables(m, c) + [_slot(m, "adam_m", n) for n in names]
            + [_slot(m, "adam_v", n) for n in names])


def test_apply_gradients_is_google_adam_weight_decay_with_clipping(dropout_off):
    c = contract.read(dropout_off)
    m = tf.saved_model.load(str(dropout_off))
    names = [v["name"] for v in c["variables"]]
    params = _variables(m, c)
    ms = [np.zeros_like(p) for p in params]
    vs = [np.zeros_like(p) for p in params]
    rng = np.random.default_rng(2)
    # Step 1 is under the clip norm, step 2 is 1000x over it and must be clipped to it.
    for step, scale in ((1, 1e-3), (2, 1e3)):
        grads = [(rng.standard_normal(p.shape) * scale / np.sqrt(p.size)).astype(np.float32)
                 for p in params]
        out = _apply(m, c, grads, 1.0)
        params, ms, vs, norm = _numpy_adamw(params, grads, ms, vs, names, 1e-2, 1.0)
        assert bool(out["applied"]) and int(out["global_step"]) == step
        np.testing.assert_allclose(float(out["global_norm"]), norm, rtol=1e-5)
        for got, want, name in zip(_variables(m, c), params, names):
            np.testing.assert_allclose(got, want, atol=1e-6, err_msg=name)
        for name, want_m, want_v in zip(names, ms, vs):
            np.testing.assert_allclose(_slot(m, "adam_m", name), want_m, atol=1e-7, err_msg=name)
            # rtol 2e-5, not float32's 1e-7: ApplyAdam computes 1 - beta2 in float32, and
            # 1 - 0.999f is 0.00099998713, 1.3e-5 below Google's 0.001 (1 - 0.9f: 2.4e-7 off).
            np.testing.assert_allclose(_slot(m, "adam_v", name), want_v, rtol=2e-5, atol=1e-12)
    # After clipping, the first moment added this step has norm (1 - beta1) * clip_norm.
    assert norm > 100


def test_non_finite_gradient_skips_the_update(dropout_off):
    c = contract.read(dropout_off)
    m = tf.saved_model.load(str(dropout_off))
    before = _variables(m, c)
    step = int(m.signatures["read_variables"]()["global_step"])
    grads = {v["gradient_key"]: tf.ones(v["shape"]) for v in c["variables"]}
    grads["grad_0003"] = tf.fill(c["variables"][3]["shape"], np.float32(np.nan))
    for scale in (1.0, 1 / 3):
        out = m.signatures["apply_gradients"](
            gradient_scale=tf.constant(scale), learning_rate=tf.constant(0.1),
            clip_norm=tf.constant(1.0), **grads)
        assert not bool(out["applied"]) and not np.isfinite(float(out["global_norm"]))
        assert int(out["global_step"]) == step
        for a, b in zip(before, _variables(m, c)):
            np.testing.assert_array_equal(a, b)


def test_gradient_scale_is_averaging_folded_into_clipping(dropout_off):
    """apply(sum, scale=1/n) is apply(sum/n, scale=1): the step an allreduce's Sum takes when its
    1/size is left to apply_gradients.  Three cases of the clip: inactive, active, and active on
    the sum but not on the mean (clipping must see the scaled norm)."""
    c = contract.read(dropout_off)
    names = [v["name"] for v in c["variables"]]
    n = 3  # 1/3 is inexact in binary: the two paths round differently, so this is no tautology
    rng = np.random.default_rng(7)

    def draw(norm):
        g = [rng.standard_normal(v["shape"]) for v in c["variables"]]
        k = norm / np.sqrt(sum(float(np.sum(x ** 2)) for x in g))
        return [(x * k).astype(np.float32) for x in g]

    for case, mean_norm in (("clip inactive", 0.2), ("clip active", 40.0),
                            ("clip active on the sum only", 1.5 / n)):
        scaled, averaged = (tf.saved_model.load(str(dropout_off)) for _ in range(2))
        params = _variables(scaled, c)
        start = params
        ms = vs = [np.zeros_like(p) for p in params]
        for step in (1, 2):
            total = draw(n * mean_norm)
            mean = [(t / np.float32(n)).astype(np.float32) for t in total]
            a = _apply(scaled, c, total, 1 / n)
            b = _apply(averaged, c, mean, 1.0)
            assert bool(a["applied"]) and bool(b["applied"]) and int(a["global_step"]) == step
            np.testing.assert_allclose(float(a["global_norm"]), mean_norm, rtol=1e-5, err_msg=case)
            np.testing.assert_allclose(float(a["global_norm"]), float(b["global_norm"]),
                                       rtol=1e-6, err_msg=case)
            # The independent reference: numpy AdamWeightDecay fed the mean, clipped by its norm.
            params, ms, vs, norm = _numpy_adamw(params, mean, ms, vs, names, 1e-2, 1.0)
            assert (norm > 1.0) == (mean_norm > 1.0)
        # Equal up to float32 rounding: a few ulps of each tensor's largest value.
        for got, want, name in zip(_state(scaled, c), _state(averaged, c), names * 3):
            np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6 * np.abs(want).max(),
                                       err_msg=f"{case}: {name}")
        for got, want, name in zip(_variables(scaled, c), params, names):
            np.testing.assert_allclose(got, want, atol=1e-6, err_msg=f"{case}: {name}")
        # The first moment scales with the clipped gradient: clipping by the unscaled sum's norm
        # (1.5 in the last case) would shrink it by a third.
        for name, want in zip(names, ms):
            np.testing.assert_allclose(_slot(scaled, "adam_m", name), want, rtol=1e-4, atol=1e-8,
                                       err_msg=f"{case}: {name}")
        moved = max(float(np.abs(g - s).max()) for g, s in zip(_variables(scaled, c), start))
        assert moved > 1e-3, case  # the comparisons above are not between untouched models


def test_eval_step_honours_is_real_example(dropout_on):
    m = tf.saved_model.load(str(dropout_on))
    batch = _batch(n=8, seed=4)
    real = np.array([1, 1, 0, 1, 0, 1, 1, 0], np.int32)
    batch["is_real_example"] = tf.constant(real)
    logits = m.signatures["predict"](**_features(batch))["logits"].numpy()
    labels = batch["label_ids"].numpy()
    # The padding rows are labelled as predicted: counting them would show in correct.
    labels[real == 0] = logits.argmax(-1)[real == 0]
    batch["label_ids"] = tf.constant(labels)
    log_probs = logits - np.log(np.exp(logits).sum(-1, keepdims=True))
    per_example = -log_probs[np.arange(8), labels]
    out = m.signatures["eval_step"](**batch)
    assert int(out["examples"]) == 5
    assert int(out["correct"]) == int(((logits.argmax(-1) == labels) * real).sum())
    np.testing.assert_allclose(float(out["loss_sum"]), (per_example * real).sum(), rtol=1e-5)


def test_predict_and_serving_models_agree(dropout_on):
    m = tf.saved_model.load(str(dropout_on))
    serving = tf.saved_model.load(str(dropout_on / contract.SERVING_DIR))
    assert list(serving.signatures) == ["serving_default"]
    sc = contract.read(dropout_on / contract.SERVING_DIR)
    assert sc["kind"] == "serving" and sc["label_names"] == ["0", "1", "2"]
    assert [v["name"] for v in sc["variables"]] == \
        [v["name"] for v in contract.read(dropout_on)["variables"]]
    f = _features(_batch(n=5, seed=5))
    want = m.signatures["predict"](**f)
    for got in (m.signatures["serving_default"](**f), serving.signatures["serving_default"](**f)):
        np.testing.assert_allclose(got["logits"], want["logits"], atol=1e-6)
    np.testing.assert_allclose(want["probabilities"].numpy().sum(-1), 1.0, rtol=1e-6)


def test_dropout_is_seeded_and_can_be_exported_off(dropout_on, dropout_off):
    batch = _batch(seed=6)

    def losses(path):
        m = tf.saved_model.load(str(path))
        run = m.signatures["train_step"]
        seeds = ([7, 1], [7, 1], [7, 2])
        got = [float(run(**batch, dropout_seed=tf.constant(s, tf.int64))["loss"]) for s in seeds]
        e = m.signatures["eval_step"](**batch)
        return got, float(e["loss_sum"]) / int(e["examples"])

    (a, b, c), _ = losses(dropout_on)
    assert a == b and a != c
    (a, b, c), eval_loss = losses(dropout_off)
    assert a == b == c
    np.testing.assert_allclose(a, eval_loss, rtol=1e-5)


def test_read_assign_round_trip(dropout_on):
    c = contract.read(dropout_on)
    m = tf.saved_model.load(str(dropout_on))
    values = [np.full(v["shape"], i, np.float32) for i, v in enumerate(c["variables"])]
    _assign(m, c, values)
    for want, got in zip(values, _variables(m, c)):
        np.testing.assert_array_equal(got, want)


def test_init_checkpoint_is_baked_in(tmp_path):
    from bertgraph.exporter import checkpoint
    from bertgraph.exporter.model import BertClassifier
    donor = BertClassifier(TINY, 2, seed=99)
    values = {n: v.numpy() for n, v in donor.named_variables if n != "bert/pooler/dense/kernel"}
    checkpoint.write(str(tmp_path / "bert_model.ckpt"), values)
    log = []
    out = export.export_tiny(tmp_path / "m", 2, SEQ,
                             init_checkpoint=str(tmp_path / "bert_model.ckpt"), log=log.append)
    c = contract.read(out)
    got = dict(zip([v["name"] for v in c["variables"]],
                   _variables(tf.saved_model.load(str(out)), c)))
    for n, v in values.items():
        np.testing.assert_array_equal(got[n], v)
    assert not np.array_equal(got["bert/pooler/dense/kernel"], donor.var("bert/pooler/dense/kernel"))
    assert sum("*INIT_FROM_CKPT*" in line for line in log) == len(values)
    assert any("bert/pooler/dense/kernel" in line and "INIT" not in line for line in log)


def test_missing_init_checkpoint_is_a_one_line_error(tmp_path, capsys):
    missing = tmp_path / "nowhere" / "bert_model.ckpt"
    with pytest.raises(ValueError, match=f"--init_checkpoint {missing}: cannot read a checkpoint at {missing}: "):
        export.export_tiny(tmp_path / "m", 2, SEQ, init_checkpoint=str(missing), log=lambda s: None)


def test_train_step_ignores_padding_examples(dropout_off):
    """A batch padded with is_real_example 0 rows (the last, short batch of an epoch) trains as
    the batch of its real rows alone: the loss is the mean over the real examples, not over the
    batch, and the gradients are those of the real rows."""
    c = contract.read(dropout_off)
    m = tf.saved_model.load(str(dropout_off))
    batch = _batch(n=6, seed=8)
    real = np.array([1, 0, 1, 1, 0, 1], bool)
    batch["is_real_example"] = tf.constant(real.astype(np.int32))
    alone = {k: tf.constant(v.numpy()[real]) for k, v in batch.items()}
    seed = tf.constant([1, 2], tf.int64)
    padded = m.signatures["train_step"](**batch, dropout_seed=seed)
    want = m.signatures["train_step"](**alone, dropout_seed=seed)
    assert int(padded["examples"]) == int(want["examples"]) == 4
    assert int(padded["correct"]) == int(want["correct"])
    np.testing.assert_allclose(float(padded["loss"]), float(want["loss"]), rtol=1e-6)
    for v in c["variables"]:
        np.testing.assert_allclose(padded[v["gradient_key"]], want[v["gradient_key"]],
                                   rtol=1e-5, atol=1e-7, err_msg=v["name"])


def test_clip_norm_is_the_input_not_one(dropout_off):
    """Clipping reads the clip_norm input (every other test passes the default 1).  Checked on
    the first moment: after one step from zero slots it is (1 - beta1) x the clipped gradient,
    while the parameters' first Adam step is about lr x sign(g) whatever the gradient's size."""
    c = contract.read(dropout_off)
    m = tf.saved_model.load(str(dropout_off))
    names = [v["name"] for v in c["variables"]]
    params = _variables(m, c)
    zeros = [np.zeros_like(p) for p in params]
    rng = np.random.default_rng(9)
    grads = [(rng.standard_normal(p.shape) / np.sqrt(p.size)).astype(np.float32) for p in params]
    clip = 0.25
    out = _apply(m, c, grads, 1.0, clip_norm=clip)
    params, ms, _, norm = _numpy_adamw(params, grads, zeros, zeros, names, 1e-2, clip)
    assert bool(out["applied"]) and norm > 4 * clip
    for name, want in zip(names, ms):
        np.testing.assert_allclose(_slot(m, "adam_m", name), want, rtol=1e-5, atol=1e-9, err_msg=name)
    for got, want, name in zip(_variables(m, c), params, names):
        np.testing.assert_allclose(got, want, atol=1e-6, err_msg=name)
