"""The emulated CUDA device as the engine sees it: a device name, arrays that stay on it through
NumPy's functions, host reads counted as a GPU's, ops on its GPU paths, and the reference's numbers
where no kernel runs."""

import numpy as np
import pytest

import autograd as ag
from autograd import backend, emulator, host_reads, kernels
from autograd import functional as F
from autograd.optim import Adam, clip_grad_norm
from tests import tf32
from tinygpt import GPT, GPTConfig

EMULATED = emulator.NAME


def test_its_arrays_stay_on_it_and_come_back_as_counted_reads():
    x = ag.tensor(np.arange(6.0).reshape(2, 3), device=EMULATED)
    assert backend.parse_device(EMULATED) == EMULATED and x.device == EMULATED
    assert backend.get_array_module(x.data) is emulator.xp
    made = [x.xp.exp(x.data), x.data.sum(), x.xp.zeros(3), x.data[0] * 2, x.xp.stack([x.data, x.data])]
    assert all(backend.device_of(a) == EMULATED for a in made)  # a sum is a 0-d device array, as CuPy's
    with host_reads.counting() as reads:
        host = x.numpy()
    assert reads.count == 1 and type(host) is np.ndarray
    np.testing.assert_array_equal(host, np.arange(6.0).reshape(2, 3))
    assert backend.device_of(backend.to_device(x.data, "cpu")) == "cpu"


def test_an_op_on_it_runs_its_gpu_path_with_the_device_current():
    seen = []

    class Twice(ag.Function):
        @staticmethod
        def forward(ctx, x):
            return x * 2

        @staticmethod
        def backward(ctx, grad):
            return grad * 2

        @staticmethod
        def forward_gpu(ctx, x):
            seen.append(emulator.current())
            return x * 2

        backward_gpu = backward

    x = ag.tensor([1.0, 2.0], requires_grad=True, device=EMULATED)
    Twice.apply(x).sum().backward()
    assert seen == [True] and not emulator.current()
    assert kernels.choose(Twice, on_gpu=True, float_dtypes={np.dtype(np.float32)})[0] is Twice.forward_gpu
    np.testing.assert_array_equal(x.grad, [2.0, 2.0])


def test_a_training_step_on_its_reference_path_gives_the_cpus_bits():
    """Where no kernel runs, the emulated device is NumPy: the same numbers as the CPU's reference,
    the embedding's gradient summed in the GPU's order (a sort) included, its float32 products
    float32's (TF32 off, whatever CUPY_TF32 asks)."""
    config = GPTConfig.tiny(n_layer=2)
    ids = np.random.default_rng(0).integers(0, config.vocab_size, (2, 9))
    grads = {}
    for device in ("cpu", EMULATED):
        ag.manual_seed(0)
        model = GPT(config).to(device).train()
        with tf32.off(device), ag.use_reference(True), ag.random.use_masks(ag.random.MaskStream(0)):
            F.cross_entropy(model(ids[:, :-1]), ids[:, 1:]).backward()
        grads[device] = [backend.to_host(p.grad) for p in model.parameters()]
    for on_cpu, emulated in zip(grads["cpu"], grads[EMULATED]):
        np.testing.assert_array_equal(emulated, on_cpu)


def test_a_misspelt_device_names_the_emulated_one_among_the_choices():
    with pytest.raises(ValueError, match="'cuda-emulated'"):
        backend.parse_device("cuda_emulated")


LR = 1e-3


def training_step(config, policy, reference):
    """A training step of a GPT on the emulated device (forward, backward, clipping, Adam), dropout
    on: the loss, the clipped gradients and the weights after Adam, on the host."""
    ag.manual_seed(0)
    model = GPT(config).to(EMULATED).train()
    optimizer = Adam(model.parameters(), lr=LR, l2=0.01)
    ids = np.random.default_rng(1).integers(0, config.vocab_size, (2, config.n_ctx + 1))
    with ag.use_reference(reference), ag.use_precision(policy), ag.random.use_masks(ag.random.MaskStream(5)):
        loss = F.cross_entropy(model(ids[:, :-1]), ids[:, 1:])
        loss.backward()
        clip_grad_norm(model.parameters(), 1.0)
        grads = {name: backend.to_host(p.grad) for name, p in model.named_parameters()}
        optimizer.step()
    return loss.item(), grads, {name: backend.to_host(p.data) for name, p in model.named_parameters()}


@pytest.mark.parametrize("policy, tolerance", [("fp32", 1e-4), ("bf16", 3e-2)])
def test_a_tiny_gpt_step_on_the_kernels_gives_the_references_numbers(policy, tolerance):
    """Every kernel of a step (embedding, dropout, layer norm, attention, GELU, cross-entropy,
    clipping, Adam) against the reference path: the loss, each clipped gradient (as a whole,
    relative to its norm), and each weight after Adam where its gradient's sign is clear (Adam's
    first step moves a weight by about lr times that sign)."""
    config = GPTConfig.tiny(n_layer=2, n_ctx=32)
    fast_loss, fast_grads, fast = training_step(config, policy, reference=False)
    loss, grads, weights = training_step(config, policy, reference=True)
    assert fast_loss == pytest.approx(loss, rel=tolerance / 10)
    for name, grad in grads.items():
        assert np.linalg.norm(fast_grads[name] - grad) <= tolerance * np.linalg.norm(grad), name
        clear = np.abs(grad) > 0.1 * np.abs(grad).max()
        np.testing.assert_allclose(
            fast[name][clear], weights[name][clear], rtol=0, atol=LR / 10, err_msg=name
        )


def attention(qkv):
    return F.multi_head_attention(qkv, 12, 0.1, generator=ag.random.MaskStream(3))


@pytest.mark.parametrize(
    "fn, shape",
    [
        (attention, (1, 512, 3 * 768)),
        (lambda x, w, b: F.layer_norm(x, w, b), (1, 512, 768)),
        (lambda logits: F.cross_entropy(logits, np.arange(512) % 40478), (512, 40478)),
    ],
    ids=["attention", "layer_norm", "cross_entropy"],
)
def test_gpt1_sized_ops_on_the_kernels_give_the_references_numbers(fn, shape):
    """GPT-1's width and n_ctx 512: attention of 12 heads of 64 with dropout, layer norm of 768,
    cross-entropy over the 40,478 tokens, forward and backward against the reference."""
    rng = np.random.default_rng(0)
    n_inputs = fn.__code__.co_argcount
    inputs = [rng.standard_normal(shape)] + [rng.standard_normal(shape[-1]) for _ in range(n_inputs - 1)]
    results = []
    for reference in (False, True):
        with ag.use_reference(reference):
            tensors = [ag.tensor(x, requires_grad=True, device=EMULATED) for x in inputs]
            out = fn(*tensors)
            out.backward(np.random.default_rng(1).standard_normal(out.shape))
        results.append([out.numpy()] + [backend.to_host(t.grad) for t in tensors])
    for fast, reference in zip(*results):
        scale = max(1.0, float(np.abs(reference).max()))
        np.testing.assert_allclose(fast, reference, rtol=2e-5, atol=2e-6 * scale)
