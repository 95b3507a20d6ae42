"""What the exporter and the converter refuse before they write anything, and what they never
delete: bad sizes, vocabularies, labels, checkpoints and output directories."""
import json
import os
import re

import numpy as np
import pytest
from safetensors.numpy import save_file

from bertgraph.exporter import checkpoint, contract, convert_hf, export
from bertgraph.exporter.config import TINY, BertConfig

SEQ = 16


def _vocab(path, size=TINY.vocab_size):
    export.write_tiny_vocab(path, size)
    return path


@pytest.mark.parametrize("field,value", [
    ("vocab_size", 0), ("num_hidden_layers", 0), ("num_attention_heads", 0), ("type_vocab_size", 0),
    ("hidden_size", "32"), ("hidden_size", 32.0), ("intermediate_size", -1), ("initializer_range", "x"),
])
def test_config_sizes_are_positive_integers(tmp_path, field, value):
    path = tmp_path / "bert_config.json"
    path.write_text(json.dumps({**TINY.to_dict(), field: value}))
    with pytest.raises(ValueError, match=f"{path}: {field} "):
        BertConfig.from_json_file(path)


def test_out_dir_that_is_not_an_export_is_never_replaced(tmp_path, monkeypatch):
    kept = tmp_path / "notes"
    kept.mkdir()
    (kept / "a.txt").write_text("keep")
    with pytest.raises(ValueError, match="holds files and is not an export"):
        export.export_tiny(kept, max_seq_length=SEQ, log=lambda s: None)
    assert (kept / "a.txt").read_text() == "keep"
    monkeypatch.chdir(kept)
    for here in (".", str(tmp_path)):
        with pytest.raises(ValueError, match="is the current directory or holds it"):
            export.export_tiny(here, max_seq_length=SEQ, log=lambda s: None)
    assert (kept / "a.txt").read_text() == "keep"
    link = tmp_path / "link"
    link.symlink_to(kept)
    with pytest.raises(ValueError, match="is a symbolic link"):
        export.export_tiny(link, max_seq_length=SEQ, log=lambda s: None)
    with pytest.raises(ValueError, match="glob patterns"):
        export.export_tiny(tmp_path / "m[1]", max_seq_length=SEQ, log=lambda s: None)
    # An empty directory, and then the export just written, are replaced.
    out = tmp_path / "model"
    out.mkdir()
    for seed in (1, 2):
        export.export_tiny(out, max_seq_length=SEQ, seed=seed, log=lambda s: None)
        assert (out / contract.CONTRACT_FILE).is_file()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["link", "model", "notes"]  # no staging left


def test_vocab_labels_and_sequence_length_are_checked(tmp_path):
    out = tmp_path / "model"
    big = _vocab(tmp_path / "big.txt", TINY.vocab_size + 1)
    with pytest.raises(ValueError, match=f"has {TINY.vocab_size + 1} tokens but the model embeds only vocab_size {TINY.vocab_size}"):
        export.export(out, TINY, 2, SEQ, big, log=lambda s: None)
    no_cls = tmp_path / "nocls.txt"
    no_cls.write_text("[PAD]\n[UNK]\n[SEP]\nw\n")
    with pytest.raises(ValueError, match=r"has no \[CLS\] token"):
        export.export(out, TINY, 2, SEQ, no_cls, log=lambda s: None)
    vocab = _vocab(tmp_path / "vocab.txt")
    for names in (["pos", "pos"], ["a", ""]):
        with pytest.raises(ValueError, match="each must be non-empty and distinct"):
            export.export(out, TINY, 2, SEQ, vocab, label_names=names, log=lambda s: None)
    with pytest.raises(ValueError, match="max_seq_length 2: want at least 3"):
        export.export(out, TINY, 2, 2, vocab, log=lambda s: None)
    assert not out.exists()


def test_init_checkpoint_by_any_of_its_files_and_never_silently_unused(tmp_path):
    vocab = _vocab(tmp_path / "vocab.txt")
    word = np.full((TINY.vocab_size, TINY.hidden_size), 0.25, np.float32)
    prefix = checkpoint.write(str(tmp_path / "bert_model.ckpt"), {"bert/embeddings/word_embeddings": word})
    for given in (prefix, prefix + ".index", prefix + ".data-00000-of-00001"):
        lines = []
        export.export(tmp_path / "model", TINY, 2, SEQ, vocab, init_checkpoint=given, log=lines.append)
        assert [s for s in lines if "INIT_FROM_CKPT" in s] == [
            f"  name = bert/embeddings/word_embeddings, shape = {word.shape}, *INIT_FROM_CKPT*"], given
    other = checkpoint.write(str(tmp_path / "other.ckpt"), {"model/layer/kernel": word})
    with pytest.raises(ValueError, match="initialises none of the model's BERT variables"):
        export.export(tmp_path / "model2", TINY, 2, SEQ, vocab, init_checkpoint=other, log=lambda s: None)


def test_command_line_booleans_and_tiny_vocab(tmp_path, capsys):
    for argv in (["--tiny", "--do_lower_case=t", "--out", str(tmp_path / "a")],
                 ["--tiny", "--vocab", str(tmp_path / "v.txt"), "--out", str(tmp_path / "a")]):
        with pytest.raises(SystemExit) as e:
            export.main(argv)
        assert e.value.code == 2
    err = capsys.readouterr().err
    assert "'t' is not a boolean" in err and "--tiny generates its vocab" in err
    assert not (tmp_path / "a").exists()


def _hf_dir(tmp_path, config, drop=None, **overrides):
    """A tiny HF BertModel directory of config's shapes (values 0), overrides replacing
    tensors by HF name, drop one file."""
    d = tmp_path / "hf"
    d.mkdir()
    tensors = {}
    for name, shape in convert_hf.expected_shapes(config).items():
        tensors[_hf_name(name)] = np.zeros(shape[::-1] if name.endswith("kernel") else shape, np.float32)
    tensors.update(overrides)
    save_file(tensors, str(d / "model.safetensors"))
    (d / "config.json").write_text(json.dumps({**config.to_dict(), "model_type": "bert"}))
    _vocab(d / "vocab.txt", config.vocab_size)
    if drop:
        os.remove(d / drop)
    return d


def _hf_name(google):
    """The HF name of a Google encoder weight (convert_hf.google_name's inverse)."""
    for hf, g in convert_hf._EMBEDDINGS.items():
        if g == google:
            return hf
    layer, part, leaf = re.fullmatch(r"bert/encoder/layer_(\d+)/(.+)/(\w+)", google).groups()
    module = {g: hf for hf, g in convert_hf._LAYER_PARTS.items()}[part]
    return f"encoder.layer.{layer}.{module}.{'weight' if leaf in ('gamma', 'kernel') else 'bias'}"


def test_convert_hf_checks_before_it_writes(tmp_path):
    out = tmp_path / "out"
    h = TINY.hidden_size
    cases = [
        (dict(drop="vocab.txt"), "has no vocab.txt"),
        ({"embeddings.word_embeddings.weight": np.zeros((100, h), np.float32)},
         r"word_embeddings: shape \(100, 32\) in safetensors, \(128, 32\) by config.json"),
        ({"encoder.layer.2.output.dense.bias": np.zeros(h, np.float32)},
         "encoder weights config.json does not describe"),
    ]
    for kwargs, want in cases:
        hf = _hf_dir(tmp_path, TINY, **kwargs)
        with pytest.raises(ValueError, match=want):
            convert_hf.convert(hf, out, log=lambda s: None)
        assert not out.exists()
        for p in hf.iterdir():
            p.unlink()
        hf.rmdir()
    convert_hf.convert(_hf_dir(tmp_path, TINY), out, log=lambda s: None)
    assert sorted(p.name for p in out.iterdir()) == [
        "bert_config.json", "bert_model.ckpt.data-00000-of-00001", "bert_model.ckpt.index", "vocab.txt"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["hf", "out"]
