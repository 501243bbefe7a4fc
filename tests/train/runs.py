"""A tiny run folder, as the training modules write it, for the tests of the modules that read one."""

import os
from pathlib import Path

import numpy as np
import pytest

import autograd as ag
from autograd.optim import Adam
from tinygpt import GPT, GPTConfig
from tinygpt.tokenizer import BPETokenizer
from train.checkpoint import save_checkpoint
from train.run import save_tokenizer, write_config

SENTENCES = [
    "the cat sat on the mat.",
    "the dog sat on the log.",
    "a cat and a dog met on a mat.",
    "café au lait, s'il vous plaît.",
    "the end of the story is near.",
]
ROOT = Path(__file__).parents[2]


def tiny_run(folder, n_ctx=16, steps=(1, 2)):
    """A run folder as the training modules write it: a BPE tokenizer trained on SENTENCES, a
    one-layer GPT with random weights, config.json, and a checkpoint for each of `steps` (the
    newest holds the model returned). Returns (model, tokenizer)."""
    os.makedirs(folder, exist_ok=True)
    tokenizer = BPETokenizer.train(SENTENCES, vocab_size=300)
    ag.manual_seed(0)
    config = GPTConfig(vocab_size=tokenizer.vocab_size, n_ctx=n_ctx, n_embd=16, n_layer=1, n_head=2)
    model = GPT(config)
    rng = np.random.default_rng(0)
    for step in steps:  # a different model at each step, so picking the newest checkpoint matters
        model.load_state_dict(
            {
                name: rng.standard_normal(p.shape).astype(p.dtype)
                for name, p in model.named_parameters()
                if p.data.ndim == 2
            },
            strict=False,
        )
        save_checkpoint(folder, step, model, Adam(model.parameters()), {})
    write_config(folder, config, {"preset": "test"})
    save_tokenizer(tokenizer, folder)
    return model.eval(), tokenizer


def stopped(capsys, main, argv):
    """(exit status, stderr) of main(argv), which must stop it with SystemExit."""
    with pytest.raises(SystemExit) as stop:
        main(argv)
    return stop.value.code, capsys.readouterr().err
