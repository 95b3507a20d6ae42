"""HuggingFace BERT (``model.safetensors`` + ``config.json`` + ``vocab.txt``) -> Google format.

    python -m bertgraph.exporter.convert_hf --hf_dir DIR --out OUT

writes ``OUT/bert_model.ckpt.{index,data-*}`` (TF1 name-based, Google variable names, readable by
``tf.train.load_checkpoint`` and BERT's ``init_from_checkpoint``), ``OUT/bert_config.json`` and
``OUT/vocab.txt``.  The weights are read with safetensors' numpy API; no torch.

HF stores a linear layer's weight as [out, in] (``y = x W^T + b``); Google stores the kernel as
[in, out] (``y = x K + b``), so every dense weight is transposed.  LayerNorm ``weight``/``bias`` are
Google's ``gamma``/``beta``.  The MLM/NSP heads, if present, are not part of a classifier and are
skipped (listed on stderr).
"""
import argparse
import json
import os
import pathlib
import re
import shutil
import sys
import tempfile

import numpy as np
from safetensors import SafetensorError
from safetensors.numpy import load_file

from . import checkpoint, outdir
from .config import BertConfig

_LAYER = re.compile(r"^encoder\.layer\.(\d+)\.(.+)$")
_LAYER_PARTS = {
    "attention.self.query": "attention/self/query",
    "attention.self.key": "attention/self/key",
    "attention.self.value": "attention/self/value",
    "attention.output.dense": "attention/output/dense",
    "attention.output.LayerNorm": "attention/output/LayerNorm",
    "intermediate.dense": "intermediate/dense",
    "output.dense": "output/dense",
    "output.LayerNorm": "output/LayerNorm",
}
_EMBEDDINGS = {
    "embeddings.word_embeddings.weight": "bert/embeddings/word_embeddings",
    "embeddings.position_embeddings.weight": "bert/embeddings/position_embeddings",
    "embeddings.token_type_embeddings.weight": "bert/embeddings/token_type_embeddings",
    "embeddings.LayerNorm.weight": "bert/embeddings/LayerNorm/gamma",
    "embeddings.LayerNorm.bias": "bert/embeddings/LayerNorm/beta",
    "pooler.dense.weight": "bert/pooler/dense/kernel",
    "pooler.dense.bias": "bert/pooler/dense/bias",
}
# Buffers, not weights.
_IGNORED = ("embeddings.position_ids",)


# The LayerNorm names of the checkpoints Google ported to the Hub first (bert-base-uncased and
# the other originals still store them), which transformers renames as it loads them.
_OLD_LAYER_NORM = re.compile(r"(LayerNorm)\.(gamma|beta)$")


def google_name(hf_name):
    """(Google name, transpose?) for an HF BertModel parameter name, or None if not an encoder
    weight.  Accepts names with or without the ``bert.`` prefix of BertFor* models, and the
    LayerNorm ``gamma``/``beta`` of the first ported checkpoints as ``weight``/``bias``."""
    name = hf_name[len("bert."):] if hf_name.startswith("bert.") else hf_name
    name = _OLD_LAYER_NORM.sub(lambda m: m[1] + {"gamma": ".weight", "beta": ".bias"}[m[2]], name)
    if name in _EMBEDDINGS:
        return _EMBEDDINGS[name], name == "pooler.dense.weight"
    m = _LAYER.match(name)
    if not m:
        return None
    layer, rest = m.groups()
    module, _, kind = rest.rpartition(".")
    part = _LAYER_PARTS.get(module)
    if part is None:
        return None
    if part.endswith("LayerNorm"):
        leaf = {"weight": "gamma", "bias": "beta"}.get(kind)
        transpose = False
    else:
        leaf = {"weight": "kernel", "bias": "bias"}.get(kind)
        transpose = kind == "weight"
    if leaf is None:
        return None
    return f"bert/encoder/layer_{layer}/{part}/{leaf}", transpose


# HF BertConfig's defaults, for the fields a config.json may leave out: where they differ from
# Google's BertConfig (type_vocab_size 2, not 16), the model HF builds from the file has HF's.
HF_BERT_DEFAULTS = {
    "vocab_size": 30522, "hidden_size": 768, "num_hidden_layers": 12, "num_attention_heads": 12,
    "intermediate_size": 3072, "hidden_act": "gelu", "hidden_dropout_prob": 0.1,
    "attention_probs_dropout_prob": 0.1, "max_position_embeddings": 512, "type_vocab_size": 2,
    "initializer_range": 0.02, "layer_norm_eps": 1e-12,
}

# HF's names of the tanh approximation of gelu (Google's "gelu"; here gelu_tanh).
_HF_GELU_TANH = ("gelu_new", "gelu_pytorch_tanh")


def bert_config_from_hf(hf):
    """The Google bert_config of an HF BertConfig dict."""
    if not isinstance(hf, dict):
        raise ValueError(f"an HF config is a JSON object of fields, not {type(hf).__name__}")
    hf = {**HF_BERT_DEFAULTS, **hf}
    if hf.get("model_type", "bert") != "bert":
        raise ValueError(f"model_type {hf.get('model_type')!r} is not bert")
    if hf.get("position_embedding_type", "absolute") != "absolute":
        raise ValueError("only absolute position embeddings are supported")
    eps = hf["layer_norm_eps"]
    if isinstance(eps, bool) or not isinstance(eps, (int, float)) or abs(eps - 1e-12) > 1e-15:
        raise ValueError(f"layer_norm_eps {eps!r} != 1e-12 (Google BERT's)")
    act = hf["hidden_act"]
    return BertConfig.from_dict({**hf, "hidden_act": "gelu_tanh" if act in _HF_GELU_TANH else act})


def convert_weights(tensors, config):
    """{Google name: ndarray} from {HF name: ndarray}; checks that the weights are the encoder
    config describes: every expected name there, none other, each of its shape."""
    out, skipped = {}, []
    for hf_name, value in tensors.items():
        g = google_name(hf_name)
        if g is None:
            if not hf_name.endswith(_IGNORED):
                skipped.append(hf_name)
            continue
        name, transpose = g
        if name in out:
            raise ValueError(f"{hf_name}: {name} given twice")
        out[name] = np.ascontiguousarray(value.T if transpose else value, dtype=np.float32)
    expected = expected_shapes(config)
    missing = sorted(set(expected) - set(out))
    if missing:
        raise ValueError(f"safetensors lacks {len(missing)} encoder weights, e.g. {missing[:3]}")
    extra = sorted(set(out) - set(expected))
    if extra:
        raise ValueError(f"safetensors holds {len(extra)} encoder weights config.json does not "
                         f"describe (num_hidden_layers {config.num_hidden_layers}), e.g. {extra[:3]}")
    for name, shape in expected.items():
        if out[name].shape != shape:
            raise ValueError(f"{name}: shape {out[name].shape} in safetensors, {shape} by config.json")
    return out, skipped


def expected_shapes(config):
    """{Google name: shape} of the encoder config describes."""
    h, i = config.hidden_size, config.intermediate_size
    shapes = {
        "bert/embeddings/word_embeddings": (config.vocab_size, h),
        "bert/embeddings/position_embeddings": (config.max_position_embeddings, h),
        "bert/embeddings/token_type_embeddings": (config.type_vocab_size, h),
        "bert/embeddings/LayerNorm/gamma": (h,), "bert/embeddings/LayerNorm/beta": (h,),
        "bert/pooler/dense/kernel": (h, h), "bert/pooler/dense/bias": (h,),
    }
    kernels = {"intermediate/dense": (h, i), "output/dense": (i, h)}
    for n in range(config.num_hidden_layers):
        for part in _LAYER_PARTS.values():
            prefix = f"bert/encoder/layer_{n}/{part}"
            if part.endswith("LayerNorm"):
                shapes[prefix + "/gamma"] = shapes[prefix + "/beta"] = (h,)
            else:
                kernel = kernels.get(part, (h, h))
                shapes[prefix + "/kernel"], shapes[prefix + "/bias"] = kernel, (kernel[1],)
    return shapes


def convert(hf_dir, out_dir, log=lambda s: print(s, file=sys.stderr)):
    """Writes the Google-format model of ``hf_dir`` to ``out_dir`` as a whole: a previous
    conversion there is replaced, a directory holding other files refused (outdir.check)."""
    hf_dir, out_dir = pathlib.Path(hf_dir), pathlib.Path(out_dir)
    for name in ("config.json", "model.safetensors", "vocab.txt"):
        if not (hf_dir / name).is_file():
            raise ValueError(f"--hf_dir {hf_dir} has no {name}")
    outdir.check(out_dir, "bert_model.ckpt.index", "a converted model")
    try:
        config = bert_config_from_hf(json.loads((hf_dir / "config.json").read_text()))
    except (json.JSONDecodeError, ValueError) as e:
        raise ValueError(f"{hf_dir / 'config.json'}: {e}") from e
    try:
        hf_weights = load_file(str(hf_dir / "model.safetensors"))
    except SafetensorError as e:  # a truncated or corrupted file: safetensors names none
        raise ValueError(f"{hf_dir / 'model.safetensors'}: {e}") from e
    weights, skipped = convert_weights(hf_weights, config)
    for name in skipped:
        log(f"skipped (not part of the encoder): {name}")
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    staging = pathlib.Path(tempfile.mkdtemp(prefix=out_dir.name + ".", dir=out_dir.parent))
    try:
        checkpoint.write(str(staging / "bert_model.ckpt"), weights)
        config.to_json_file(staging / "bert_config.json")
        shutil.copyfile(hf_dir / "vocab.txt", staging / "vocab.txt")
        umask = os.umask(0)
        os.umask(umask)
        staging.chmod(0o777 & ~umask)  # mkdtemp's 0700 is for the staging only
        outdir.replace(staging, out_dir)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return out_dir


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--hf_dir", required=True,
                   help="folder with model.safetensors, config.json and vocab.txt")
    p.add_argument("--out", required=True)
    a = p.parse_args(argv)
    try:
        print(convert(a.hf_dir, a.out))
    except ValueError as e:  # bad input, said without a traceback
        print(f"convert_hf: {e}", file=sys.stderr)
        sys.exit(1)


if __name__ == "__main__":
    main()
