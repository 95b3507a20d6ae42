"""Google-format ``bert_config.json``."""
import dataclasses
import json
import pathlib


@dataclasses.dataclass(frozen=True)
class BertConfig:
    """The fields of Google BERT's ``BertConfig`` (modeling.py), with its defaults."""

    vocab_size: int
    hidden_size: int = 768
    num_hidden_layers: int = 12
    num_attention_heads: int = 12
    intermediate_size: int = 3072
    hidden_act: str = "gelu"
    hidden_dropout_prob: float = 0.1
    attention_probs_dropout_prob: float = 0.1
    max_position_embeddings: int = 512
    type_vocab_size: int = 16
    initializer_range: float = 0.02

    def __post_init__(self):
        # Sizes are positive integers (a JSON 32.0 or "32" would fail deep inside TensorFlow, a
        # 0 build a model that exports and then fails or is refused by Go's Load).
        for name in _SIZES:
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} {value!r} is not an integer >= 1")
        for name in ("hidden_dropout_prob", "attention_probs_dropout_prob", "initializer_range"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)):
                raise ValueError(f"{name} {value!r} is not a number")
        if self.hidden_size % self.num_attention_heads:
            raise ValueError(
                f"hidden_size {self.hidden_size} is not a multiple of num_attention_heads "
                f"{self.num_attention_heads}")
        if self.hidden_act not in ACTIVATIONS:
            raise ValueError(f"hidden_act {self.hidden_act!r} is not one of {sorted(ACTIVATIONS)}")
        for name in ("hidden_dropout_prob", "attention_probs_dropout_prob"):
            if not 0 <= getattr(self, name) < 1:
                raise ValueError(f"{name} {getattr(self, name)!r} is not in [0, 1)")
        # The truncated normal's stddev for the weights no checkpoint covers (the classifier's):
        # NaN (which Python's json reads) would start them as NaN, and every step would be
        # skipped as not finite.
        if not 0 < self.initializer_range < float("inf"):
            raise ValueError(f"initializer_range {self.initializer_range!r} is not a positive finite number")

    @classmethod
    def from_dict(cls, d):
        if not isinstance(d, dict):
            raise ValueError(f"a BERT config is a JSON object of fields, not {type(d).__name__} {d!r:.60}")
        names = {f.name for f in dataclasses.fields(cls)}
        return cls(**{k: v for k, v in d.items() if k in names})

    @classmethod
    def from_json_file(cls, path):
        path = pathlib.Path(path)
        try:
            d = json.loads(path.read_text())
        except (OSError, json.JSONDecodeError) as e:
            raise ValueError(f"{path}: cannot read BERT config: {e}") from e
        try:
            return cls.from_dict(d)
        except (TypeError, ValueError) as e:
            raise ValueError(f"{path}: {e}") from e

    def to_dict(self):
        return dataclasses.asdict(self)

    def to_json_file(self, path):
        pathlib.Path(path).write_text(json.dumps(self.to_dict(), indent=2, sort_keys=True) + "\n")


# The fields that are sizes.
_SIZES = ("vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads",
          "intermediate_size", "max_position_embeddings", "type_vocab_size")

# hidden_act values.  "gelu" is the exact erf form, as HuggingFace and TF Model Garden define it (the
# pretrained weights gorovod converts were trained with it); Google's original modeling.py computed
# "gelu" with the tanh approximation, available here as "gelu_tanh" (alias "gelu_new").  The two differ
# by less than 1e-3 per activation.
ACTIVATIONS = ("gelu", "gelu_tanh", "gelu_new", "relu", "tanh", "linear")

# The tiny configuration used by tests: 2 layers, hidden 32.
TINY = BertConfig(vocab_size=128, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                  intermediate_size=64, max_position_embeddings=64, type_vocab_size=2)
