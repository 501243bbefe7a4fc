"""GPTConfig: the sizes and rates of a GPT-1 model, with named presets."""

import math
from dataclasses import asdict, dataclass, fields

from .files import read_json

ACTIVATIONS = {"gelu": "tanh", "gelu_new": "tanh", "gelu_exact": "none"}  # afn -> F.gelu's approximate
SIZES = ("vocab_size", "n_ctx", "n_embd", "n_layer", "n_head", "n_inner")
# 40 GB of float32 weights, far past what this NumPy GPT trains: a config asking for more is a typo or
# a bad file (a vocab_size of 10**12 would otherwise start allocating terabytes).
MAX_PARAMETERS = 10**10
MAX_LAYERS = 1024  # each block is a few Python objects: a config of 10**8 tiny blocks never finishes building


@dataclass
class GPTConfig:
    vocab_size: int = 40478
    n_ctx: int = 512
    n_embd: int = 768
    n_layer: int = 12
    n_head: int = 12
    n_inner: int = None  # width of the MLP; 4 * n_embd when None
    afn: str = "gelu"  # "gelu" is GPT-1's tanh approximation; "gelu_exact" uses erf
    embd_pdrop: float = 0.1
    attn_pdrop: float = 0.1
    resid_pdrop: float = 0.1
    layer_norm_epsilon: float = 1e-5
    initializer_range: float = 0.02

    def __post_init__(self):
        """Every field checked for its type and range, and the size of the whole model bounded."""
        if self.n_inner is None and type(self.n_embd) is int:  # a bad n_embd is refused below
            self.n_inner = 4 * self.n_embd
        for name in SIZES:
            value = getattr(self, name)
            if type(value) is not int or value < 1:
                raise ValueError(f"GPTConfig: {name} must be a positive integer, got {value!r}")
        if self.n_layer > MAX_LAYERS:
            raise ValueError(f"GPTConfig: n_layer={self.n_layer} is more than the {MAX_LAYERS} allowed")
        if self.n_embd % self.n_head:
            raise ValueError(f"GPTConfig: n_embd={self.n_embd} is not divisible by n_head={self.n_head}")
        if not isinstance(self.afn, str) or self.afn not in ACTIVATIONS:
            raise ValueError(f"GPTConfig: afn must be one of {sorted(ACTIVATIONS)}, got {self.afn!r}")
        for name in ("embd_pdrop", "attn_pdrop", "resid_pdrop"):
            value = getattr(self, name)
            if not _is_number(value) or not 0 <= value < 1:
                raise ValueError(f"GPTConfig: {name} must lie in [0, 1), got {value!r}")
        if not _is_number(self.layer_norm_epsilon) or self.layer_norm_epsilon <= 0:
            raise ValueError(
                f"GPTConfig: layer_norm_epsilon must be a positive number, got {self.layer_norm_epsilon!r}"
            )
        if not _is_number(self.initializer_range) or self.initializer_range < 0:
            raise ValueError(
                f"GPTConfig: initializer_range must be a number >= 0, got {self.initializer_range!r}"
            )
        if self.n_parameters > MAX_PARAMETERS:
            raise ValueError(
                f"GPTConfig: {self.n_parameters:,} parameters are more than the {MAX_PARAMETERS:,} allowed; "
                f"check {', '.join(f'{name}={getattr(self, name)}' for name in SIZES)}"
            )

    def parameter_shapes(self):
        """{name: shape} of every parameter of GPT(self), named as in the openai-gpt checkpoints."""
        d, inner = self.n_embd, self.n_inner
        shapes = {"tokens_embed.weight": (self.vocab_size, d), "positions_embed.weight": (self.n_ctx, d)}
        block = {
            "attn.c_attn.weight": (d, 3 * d),
            "attn.c_attn.bias": (3 * d,),
            "attn.c_proj.weight": (d, d),
            "attn.c_proj.bias": (d,),
            "ln_1.weight": (d,),
            "ln_1.bias": (d,),
            "mlp.c_fc.weight": (d, inner),
            "mlp.c_fc.bias": (inner,),
            "mlp.c_proj.weight": (inner, d),
            "mlp.c_proj.bias": (d,),
            "ln_2.weight": (d,),
            "ln_2.bias": (d,),
        }
        for layer in range(self.n_layer):
            shapes.update({f"h.{layer}.{name}": shape for name, shape in block.items()})
        return shapes

    @property
    def n_parameters(self):
        """How many numbers GPT(self) holds."""
        return sum(math.prod(shape) for shape in self.parameter_shapes().values())

    def check_weights(self, state, path):
        """Before a model is built from the state dict read from `path` (building allocates every
        parameter, so a config.json could otherwise ask for far more than the weights hold): the
        state's names and shapes must be this config's. A ValueError names the file and the keys
        that are missing, unexpected or mis-shaped."""
        shapes = self.parameter_shapes()
        problems = {
            "missing keys": [name for name in shapes if name not in state],
            "unexpected keys": [name for name in state if name not in shapes],
            "mis-shaped keys": [
                f"{name} {tuple(state[name].shape)}, the config makes {shape}"
                for name, shape in shapes.items()
                if name in state and tuple(state[name].shape) != shape
            ],
        }
        if any(problems.values()):
            raise ValueError(
                f"{path} does not hold the config's weights: "
                + "; ".join(f"{what}: {_first(keys)}" for what, keys in problems.items() if keys)
            )

    @classmethod
    def gpt1(cls, **overrides):
        """GPT-1 as in the paper: 12 layers, 768 wide, 12 heads, 512 positions (116,534,784 parameters)."""
        return cls(**overrides)

    @classmethod
    def mini(cls, **overrides):
        """4 layers, 256 wide, 4 heads, 256 positions: a small model for a CPU."""
        return cls(**{"n_ctx": 256, "n_embd": 256, "n_layer": 4, "n_head": 4, **overrides})

    @classmethod
    def tiny(cls, **overrides):
        """5 layers, 128 wide, 4 heads, 128 positions: about 1M parameters besides the embeddings."""
        return cls(**{"n_ctx": 128, "n_embd": 128, "n_layer": 5, "n_head": 4, **overrides})

    @classmethod
    def preset(cls, name, **overrides):
        """A preset by name: 'gpt1', 'mini' or 'tiny'; keyword arguments override its fields."""
        presets = {"gpt1": cls.gpt1, "mini": cls.mini, "tiny": cls.tiny}
        if name not in presets:
            raise ValueError(f"unknown preset {name!r}; choose one of {', '.join(presets)}")
        return presets[name](**overrides)

    def to_dict(self):
        return asdict(self)

    # The config.json of the openai-gpt checkpoints calls n_ctx "n_positions".
    def to_hf_dict(self):
        config = {k: v for k, v in asdict(self).items() if k != "n_ctx"}
        return {
            "architectures": ["OpenAIGPTLMHeadModel"],
            "model_type": "openai-gpt",
            "n_positions": self.n_ctx,
            **config,
        }

    @classmethod
    def from_hf_dict(cls, config):
        """A config from the dict of an openai-gpt config.json (keys it does not know are left out)."""
        if not isinstance(config, dict):
            raise ValueError(f"GPTConfig: expected a JSON object of settings, got {type(config).__name__}")
        known = {f.name for f in fields(cls)}
        values = {k: v for k, v in config.items() if k in known}
        if "n_positions" in config:
            values["n_ctx"] = config["n_positions"]
        return cls(**values)

    @classmethod
    def from_json_file(cls, path):
        """A config from an openai-gpt config.json; errors name the file and the field."""
        config = read_json(path)
        try:
            return cls.from_hf_dict(config)
        except ValueError as error:
            raise ValueError(f"{path}: {error}") from None


def _is_number(value):
    """An int or a finite float (a bool is neither here)."""
    return type(value) is int or (isinstance(value, float) and math.isfinite(value))


def _first(names, count=5):
    """The first `count` names, and how many more there are."""
    more = f" and {len(names) - count} more" if len(names) > count else ""
    return ", ".join(names[:count]) + more
