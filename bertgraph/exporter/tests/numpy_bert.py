"""An independent numpy BERT forward pass over HuggingFace-named weights (the reference the
converted checkpoint and our TF graph are checked against).  Written from the BERT paper / HF
BertModel semantics: exact-erf GELU, LayerNorm eps from the HF config, HF [out, in] linear weights,
additive mask with the dtype's most negative value."""
import math

import numpy as np

_erf = np.vectorize(math.erf, otypes=[np.float64])


def _linear(x, w, b):
    return x @ w.T + b


def _layer_norm(x, w, b, eps):
    mu = x.mean(-1, keepdims=True)
    var = ((x - mu) ** 2).mean(-1, keepdims=True)
    return (x - mu) / np.sqrt(var + eps) * w + b


def _gelu(x):
    return 0.5 * x * (1.0 + _erf(x / math.sqrt(2.0)))


def forward(weights, hf_config, input_ids, attention_mask, token_type_ids):
    """(last_hidden_state [B, S, H], pooler_output [B, H]) in float64."""
    w = {k[len("bert."):] if k.startswith("bert.") else k: v.astype(np.float64)
         for k, v in weights.items()}
    eps = hf_config.get("layer_norm_eps", 1e-12)
    heads = hf_config["num_attention_heads"]
    b, s = input_ids.shape
    x = (w["embeddings.word_embeddings.weight"][input_ids]
         + w["embeddings.token_type_embeddings.weight"][token_type_ids]
         + w["embeddings.position_embeddings.weight"][np.arange(s)][None])
    x = _layer_norm(x, w["embeddings.LayerNorm.weight"], w["embeddings.LayerNorm.bias"], eps)
    h = x.shape[-1]
    d = h // heads
    mask = np.where(attention_mask[:, None, None, :] > 0, 0.0, np.finfo(np.float64).min)
    for n in range(hf_config["num_hidden_layers"]):
        p = f"encoder.layer.{n}."

        def proj(name, t):
            y = _linear(t, w[p + name + ".weight"], w[p + name + ".bias"])
            return y.reshape(b, s, heads, d).transpose(0, 2, 1, 3)

        q, k, v = (proj("attention.self." + m, x) for m in ("query", "key", "value"))
        scores = q @ k.transpose(0, 1, 3, 2) / math.sqrt(d) + mask
        scores -= scores.max(-1, keepdims=True)
        probs = np.exp(scores)
        probs /= probs.sum(-1, keepdims=True)
        ctx = (probs @ v).transpose(0, 2, 1, 3).reshape(b, s, h)
        attn = _linear(ctx, w[p + "attention.output.dense.weight"],
                       w[p + "attention.output.dense.bias"])
        x = _layer_norm(attn + x, w[p + "attention.output.LayerNorm.weight"],
                        w[p + "attention.output.LayerNorm.bias"], eps)
        inter = _gelu(_linear(x, w[p + "intermediate.dense.weight"],
                              w[p + "intermediate.dense.bias"]))
        out = _linear(inter, w[p + "output.dense.weight"], w[p + "output.dense.bias"])
        x = _layer_norm(out + x, w[p + "output.LayerNorm.weight"], w[p + "output.LayerNorm.bias"],
                        eps)
    pooled = np.tanh(_linear(x[:, 0], w["pooler.dense.weight"], w["pooler.dense.bias"]))
    return x, pooled
