"""Reads from the device to the host: every one goes through backend.to_host, which counts it,
and a training step makes none. On a GPU each read makes the host wait for the GPU; on the CPU
the count is the same, so these tests hold a step to zero reads without a GPU."""

import numpy as np
import pytest

import autograd as ag
from autograd import backend, host_reads
from autograd import functional as F
from autograd.optim import Adam, clip_grad_norm
from tinygpt import GPT, GPTConfig
from tinygpt.heads import GPTForClassification
from tinygpt.transformations import collate

VOCAB = 50


def small_gpt(device="cpu", dropout=0.1):
    ag.manual_seed(0)
    pdrop = dict(embd_pdrop=dropout, attn_pdrop=dropout, resid_pdrop=dropout)
    return GPT(GPTConfig(vocab_size=VOCAB, n_ctx=16, n_embd=16, n_layer=2, n_head=2, **pdrop)).to(device)


def token_batch(seed=0):
    """Token ids (4, 9) on the host, as the training loops pass them."""
    return np.random.default_rng(seed).integers(0, VOCAB, size=(4, 9))


def training_step(model, optimizer, batch):
    """One pre-training step as the loops take it: forward, loss, backward, clip, update."""
    logits = model(batch[:, :-1])
    loss = F.cross_entropy(logits, batch[:, 1:])
    loss.backward()
    clip_grad_norm(model.parameters(), 1.0)
    optimizer.step()
    optimizer.zero_grad()
    return loss


def test_a_training_step_reads_nothing_from_the_device(device):
    model = small_gpt(device)
    optimizer = Adam(model.parameters(), lr=1e-3)
    with host_reads.counting() as reads:
        for seed in range(2):
            training_step(model, optimizer, token_batch(seed))
    assert reads.count == 0


def test_a_read_in_the_step_is_counted(device):
    """The counter is live inside the step: the zero above is not for want of counting."""
    model = small_gpt(device)
    optimizer = Adam(model.parameters(), lr=1e-3)
    with host_reads.counting() as reads:
        loss = training_step(model, optimizer, token_batch())
        loss.item()
    assert reads.count == 1


def test_a_fine_tuning_step_reads_nothing_from_the_device(device):
    """A task head's step: L3 = L2 + 0.5 L1 through the classify-token states, then the update."""
    head = GPTForClassification(small_gpt(device), 3)
    optimizer = Adam(head.parameters(), lr=1e-3)
    rng = np.random.default_rng(0)
    batch = collate([[list(rng.integers(0, VOCAB, size=n))] for n in (5, 8, 3)], [0, 2, 1])
    with host_reads.counting() as reads:
        loss, _, _ = head.loss(batch, lm_coef=0.5)
        loss.backward()
        clip_grad_norm(head.parameters(), 1.0)
        optimizer.step()
    assert reads.count == 0


def test_clip_grad_norm_returns_the_norm_as_a_0d_array_on_the_device(device):
    param = ag.nn.Parameter(ag.tensor(np.zeros(2), device=device).data)
    param.grad = param.xp.asarray(np.array([3.0, 4.0], dtype=np.float32))
    with host_reads.counting() as reads:
        norm = clip_grad_norm([param], 1.0)
    assert reads.count == 0
    assert norm.shape == () and backend.device_of(norm) == param.device
    assert float(backend.to_host(norm)) == pytest.approx(5.0)
    np.testing.assert_allclose(backend.to_host(param.grad), [0.6, 0.8], rtol=1e-5)


def test_item_numpy_and_repr_are_counted(device):
    x = ag.tensor([1.0, 2.0], device=device)
    before = host_reads.total()
    with host_reads.counting() as reads:
        x.numpy()
        x.sum().item()
        repr(x)
    assert reads.count == 3 and host_reads.total() == before + 3


def test_host_ids_are_checked_before_they_move_and_cost_no_read(device):
    """Ids and targets given on the host are checked there: with today's messages, and no read."""
    model = small_gpt(device)
    with host_reads.counting() as reads:
        with pytest.raises(ValueError, match=rf"token ids must lie in \[0, {VOCAB}\), got -1\.\.3$"):
            model(np.array([[0, 3, -1]]))
        with pytest.raises(ValueError, match=rf"token ids must lie in \[0, {VOCAB}\), got 0\.\.{VOCAB}$"):
            model([[0, VOCAB]])
        with pytest.raises(IndexError, match=r"embedding: ids must lie in \[0, 3\), got 0\.\.3$"):
            F.embedding(ag.tensor([[0, 3]]), ag.tensor(np.ones((3, 2)), device=device))
        with pytest.raises(IndexError, match=r"targets must lie in \[0, 3\) or equal ignore_index=-100$"):
            F.cross_entropy(ag.tensor(np.zeros((2, 3)), device=device), [0, 3])
        F.cross_entropy(ag.tensor(np.zeros((2, 3)), device=device), [0, -100])  # ignored: fine
    assert reads.count == 0


def test_ids_already_on_the_gpu_are_not_read_back(gpu_device):
    model = small_gpt(gpu_device)
    ids = backend.to_device(token_batch(), backend.parse_device(gpu_device))
    with host_reads.counting() as reads:
        loss = F.cross_entropy(model(ids[:, :-1]), ids[:, 1:])
        loss.backward()
    assert reads.count == 0


def test_moving_an_array_to_the_host_is_a_counted_read(gpu_device):
    on_gpu = backend.to_device(np.ones(3), backend.parse_device(gpu_device))
    with host_reads.counting() as reads:
        backend.to_device(on_gpu, "cpu")
        ag.tensor(on_gpu, device="cpu")
        backend.to_device(np.ones(3), "cpu")  # already there: no read
    assert reads.count == 2
