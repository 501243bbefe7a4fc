"""A model on GPU 1 computes on GPU 1 whichever GPU is current: every op allocates and launches
under its arrays' device, and the ids, positions, targets and Adam's moments are made beside the
weights. Run on tests/fake_cuda.py's stand-in for CuPy, which has two GPUs and, as CuPy does,
refuses an operation on arrays of a GPU that is not the current one."""

import numpy as np
import pytest

import autograd as ag
from autograd import backend
from autograd import functional as F
from autograd.optim import Adam, clip_grad_norm
from tinygpt import GPT, GPTConfig
from tinygpt.heads import make_head

from .. import fake_cuda

CONFIG = GPTConfig.tiny(n_layer=2)


def training_step(device, reference):
    """One step of a tiny GPT on `device`: forward, loss, backward, clipping, Adam."""
    ag.manual_seed(0)
    model = GPT(CONFIG).to(device).train()
    optimizer = Adam(model.parameters(), lr=1e-3, l2=0.01)
    ids = np.random.default_rng(0).integers(0, CONFIG.vocab_size, (2, 9))
    with ag.use_reference(reference), ag.random.use_masks(ag.random.MaskStream(0)):
        loss = F.cross_entropy(model(ids[:, :-1]), ids[:, 1:])
        loss.backward()
        clip_grad_norm(model.parameters(), 1.0)
        optimizer.step()
    return model, optimizer, loss


def test_a_step_of_a_model_on_gpu_1_runs_there_and_gives_the_cpus_numbers(monkeypatch):
    cpu_model, _, cpu_loss = training_step("cpu", reference=True)
    fake_cuda.install(monkeypatch)
    assert fake_cuda.Device.current == 0
    model, optimizer, loss = training_step("cuda:1", reference=True)
    assert loss.device == "cuda:1" and backend.to_host(loss.data) == cpu_loss.data
    for p, on_cpu in zip(model.parameters(), cpu_model.parameters()):
        assert p.device == "cuda:1" and backend.device_of(p.grad) == "cuda:1"
        np.testing.assert_array_equal(backend.to_host(p.data), on_cpu.data)
    assert {backend.device_of(m) for m in optimizer.m + optimizer.v} == {"cuda:1"}


def test_every_kernel_of_a_step_on_gpu_1_launches_with_gpu_1_current(monkeypatch):
    launches = fake_cuda.install(monkeypatch)
    training_step("cuda:1", reference=False)
    sources = {"embedding", "layer_norm", "gelu", "attention", "column_sums", "cross_entropy", "adam"}
    assert {launch.source for launch in launches} >= sources and {launch.device for launch in launches} == {1}
    assert fake_cuda.Device.current == 0  # and each op gave the current device back


def test_a_head_and_a_loaded_model_on_gpu_1_run_there(monkeypatch, tmp_path):
    ag.manual_seed(0)
    GPT(CONFIG).save_pretrained(tmp_path)
    fake_cuda.install(monkeypatch)
    model = GPT.from_pretrained(tmp_path, device="cuda:1")
    head = make_head("classification", model, n_classes=2)
    head.to("cuda:1")
    ids = np.random.default_rng(1).integers(0, CONFIG.vocab_size, (3, 1, 6))
    with ag.use_reference(True):
        logits, lm_logits = head(ids, np.full((3, 1), 5))
        loss = head.task_loss(logits, [0, 1, 1]) + 0.5 * F.cross_entropy(lm_logits[:, :, :-1], ids[:, :, 1:])
        loss.backward()
    assert loss.device == "cuda:1" and {p.device for p in head.parameters()} == {"cuda:1"}


def test_tensors_made_or_combined_outside_ops_go_to_their_tensors_gpu(monkeypatch):
    fake_cuda.install(monkeypatch)
    x = ag.tensor(np.arange(6.0).reshape(2, 3), requires_grad=True, device="cuda:1")
    y = ag.where(np.array([True, False, True]), x * np.ones(3), x + 1.0)
    mask = x > np.full(3, 2.0)
    y.sum().backward()
    assert y.device == mask.device == backend.device_of(x.grad) == "cuda:1"
    np.testing.assert_array_equal(backend.to_host(x.grad), [[1, 1, 1], [1, 1, 1]])


@pytest.mark.parametrize("name", ["cuda:1", "cuda"])
def test_the_stand_in_refuses_arrays_of_a_gpu_that_is_not_current(monkeypatch, name):
    """The check the tests above rest on: an operation on GPU 1's arrays with GPU 0 current fails."""
    fake_cuda.install(monkeypatch)
    on_1 = backend.to_device(np.ones(3, np.float32), "cuda:1")
    with pytest.raises(ValueError, match="an array of GPU 1 used while GPU 0 is current"):
        on_1 + 1
    with backend.device_scope(on_1):
        assert backend.device_of(on_1 * 2) == "cuda:1"
