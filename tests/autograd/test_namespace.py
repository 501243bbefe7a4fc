"""What `import autograd as ag` reaches, as `import torch` reaches torch.nn and torch.optim."""

import importlib
import subprocess
import sys
from pathlib import Path

import numpy as np

import autograd as ag

ROOT = Path(__file__).parents[2]


def test_a_bare_import_reaches_nn_optim_functional_and_the_gradcheck_functions():
    """In a fresh interpreter, where no other import has loaded the submodules first."""
    code = (
        "import autograd as ag; from autograd import gradcheck; "
        "assert callable(gradcheck) and gradcheck is ag.gradcheck; "
        "print(ag.nn.Linear.__name__, ag.optim.Adam.__name__, ag.functional.gelu.__name__, "
        "ag.jacobian_check.__name__, ag.GradcheckError.__name__)"
    )
    result = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["Linear", "Adam", "gelu", "jacobian_check", "GradcheckError"]


def test_ag_gradcheck_checks_a_gradient_and_the_module_keeps_its_names():
    x = ag.tensor(np.random.default_rng(0).standard_normal((3, 4)), dtype="float64", requires_grad=True)
    ag.gradcheck(lambda x: x.tanh(), [x])
    ag.jacobian_check(lambda x: x.tanh(), [x])
    module = importlib.import_module("autograd.gradcheck")  # what `from autograd.gradcheck import` reads
    assert (module.gradcheck, module.jacobian_check, module.GradcheckError) == (
        ag.gradcheck,
        ag.jacobian_check,
        ag.GradcheckError,
    )
