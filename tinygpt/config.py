"""GPTConfig: the sizes and rates of a GPT-1 model, with named presets."""

from dataclasses import asdict, dataclass, fields

ACTIVATIONS = {"gelu": "tanh", "gelu_new": "tanh", "gelu_exact": "none"}  # afn -> F.gelu's approximate


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
        if self.n_inner is None:
            self.n_inner = 4 * self.n_embd
        for name in ("vocab_size", "n_ctx", "n_embd", "n_layer", "n_head", "n_inner"):
            value = getattr(self, name)
            if type(value) is not int or value < 1:
                raise ValueError(f"GPTConfig: {name} must be a positive integer, got {value!r}")
        if self.n_embd % self.n_head:
            raise ValueError(f"GPTConfig: n_embd={self.n_embd} is not divisible by n_head={self.n_head}")
        if self.afn not in ACTIVATIONS:
            raise ValueError(f"GPTConfig: afn must be one of {sorted(ACTIVATIONS)}, got {self.afn!r}")
        for name in ("embd_pdrop", "attn_pdrop", "resid_pdrop"):
            if not 0 <= getattr(self, name) < 1:
                raise ValueError(f"GPTConfig: {name} must lie in [0, 1), got {getattr(self, name)!r}")

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
        known = {f.name for f in fields(cls)}
        values = {k: v for k, v in config.items() if k in known}
        if "n_positions" in config:
            values["n_ctx"] = config["n_positions"]
        return cls(**values)
