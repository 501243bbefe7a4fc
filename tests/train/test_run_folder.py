"""GPT.from_pretrained reads a run folder as the training modules write it, as their commands do."""

import numpy as np

from tinygpt import GPT
from train.run_folder import load_run

from .runs import tiny_run


def test_from_pretrained_of_a_run_is_the_model_every_command_loads(tmp_path):
    model, _ = tiny_run(tmp_path / "run", steps=(1, 2, 10))
    loaded = GPT.from_pretrained(tmp_path / "run")
    by_command, _ = load_run(tmp_path / "run")
    for name, array in model.state_dict().items():
        assert np.array_equal(loaded.state_dict()[name], array), name
        assert np.array_equal(by_command.state_dict()[name], array), name
