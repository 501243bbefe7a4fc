"""Arrays changed in place after the forward that saw them: backward refuses them in one line that
names the op and the input (or output), rather than give a gradient of values the forward never
saw; reads, writes of the same values, writes before the forward or after the backward pass."""

import numpy as np
import pytest
from hypothesis import given

import autograd as ag
from autograd import backend
from autograd import functional as F
from autograd.testing import arrays, shapes


def host(array):
    return backend.to_host(array).copy()


def fill(x):
    x.data[:] = 10


def add_to_one_entry(x):
    x.data[0] += 1


def set_anew(x):
    x.data = backend.to_device(np.full(x.shape, 7, x.dtype), x.device)


def subtract(x):
    x.data -= 1


WRITES = {
    "x.data[:] = 10": fill,
    "x.data[0] += 1": add_to_one_entry,
    "x.data = other": set_anew,
    "x.data -= 1": subtract,
}


def changed(what):
    """The start of the error, for an op's input or output, on one line."""
    return rf"^{what} \(a float32 \(\d+(, \d+)*,?\) tensor\) was changed in place after the forward;[^\n]*$"


@pytest.mark.parametrize("write", WRITES.values(), ids=WRITES.keys())
@given(a=arrays(shapes(min_dims=1), dtype=np.float32))
def test_backward_refuses_an_input_changed_in_place_after_the_forward(device, write, a):
    """(x * x).sum() saw x; x changed before backward, so 2 x would be of the wrong x."""
    x = ag.tensor(a, requires_grad=True, device=device)
    y = (x * x).sum()
    write(x)
    with pytest.raises(RuntimeError, match=changed("Mul's argument a")):
        y.backward()
    assert x.grad is None


@pytest.mark.parametrize("write", WRITES.values(), ids=WRITES.keys())
def test_the_error_names_which_input_changed(device, write):
    w = ag.tensor([1.0, 2.0, 3.0], requires_grad=True, device=device)
    x = ag.tensor([4.0, 5.0, 6.0], device=device)  # no gradient of its own, but w's is x
    y = (w * x).sum()
    write(x)
    with pytest.raises(RuntimeError, match=changed("Mul's argument b")):
        y.backward()


@pytest.mark.parametrize("write", WRITES.values(), ids=WRITES.keys())
def test_backward_refuses_an_output_changed_in_place_that_its_op_saved(device, write):
    """Exp's backward reads its own output: a change to it, even before any op used it, is refused."""
    x = ag.tensor([0.0, 1.0, 2.0], requires_grad=True, device=device)
    y = x.exp()
    write(y)
    with pytest.raises(RuntimeError, match=changed("Exp's output")):
        y.sum().backward()


def test_backward_refuses_weights_an_optimizer_stepped_after_the_forward(device):
    layer = ag.nn.Linear(3, 2).to(device)
    optimizer = ag.optim.Adam(layer.parameters(), lr=0.1)
    x = ag.tensor(np.ones((4, 3)), device=device)
    layer(x).sum().backward()  # the gradients of a first step
    loss = layer(x).sum()  # a forward with the weights before the step
    optimizer.step()
    with pytest.raises(RuntimeError, match=changed("Linear's argument weight")):
        loss.backward()


@given(a=arrays(shapes(min_dims=1)))
def test_reading_data_or_writing_the_same_values_back_leaves_gradients_right(device, a):
    x = ag.tensor(a, requires_grad=True, dtype=np.float64, device=device)
    y = (x * x).sum()
    x.data[...] = x.data.copy()
    y.backward()
    np.testing.assert_allclose(host(x.grad), 2 * a)


def test_nan_is_no_change(device):
    x = ag.tensor([np.nan, 1.0], requires_grad=True, device=device)
    y = (x * x).sum()
    x.data[1] = 1.0
    y.backward()
    np.testing.assert_array_equal(host(x.grad), [np.nan, 2.0])


@pytest.mark.parametrize("write", WRITES.values(), ids=WRITES.keys())
def test_writes_before_the_forward_or_after_the_backward_are_free(device, write):
    x = ag.tensor([1.0, 2.0, 3.0], requires_grad=True, device=device)
    write(x)
    (x * x).sum().backward()
    write(x)
    expected = 2 * host(x.data)
    x.grad = None
    (x * x).sum().backward()
    np.testing.assert_allclose(host(x.grad), expected)


def test_a_forward_after_a_write_sees_the_new_values_and_refuses_later_ones(device):
    """A graph made after a write into an array read earlier backpropagates with the new values;
    the graph made before it refuses, and so does the newer one once the array changes again."""
    x = ag.tensor([1.0, 2.0, 3.0], requires_grad=True, device=device)
    before = (x * x).sum()
    array = x.data
    array[:] = 10
    after, later = (x * x).sum(), (x * x).sum()
    after.backward()
    np.testing.assert_allclose(host(x.grad), [20, 20, 20])
    array[:] = 5
    for graph in (before, later):
        with pytest.raises(RuntimeError, match=changed("Mul's argument a")):
            graph.backward()


def test_a_graph_dropped_without_backward_lets_go_of_its_tensors(device):
    """No copy is kept for a graph that is gone: reading .data costs nothing again."""
    x = ag.tensor([1.0, 2.0], requires_grad=True, device=device)
    y = (x * x).sum()
    x.data[:] = x.data  # a read while the graph holds x: a copy is kept
    del y
    assert x._holders == 0 and x._snapshot is None


def test_a_training_step_reads_no_array_through_data(device, monkeypatch):
    """The engine reads its arrays as `_data`: a forward, a backward, clipping and an Adam step
    take no copies and make no comparisons."""
    reads = []
    data = ag.Tensor.data
    monkeypatch.setattr(ag.Tensor, "data", property(lambda t: reads.append(t) or data.fget(t), data.fset))
    ag.manual_seed(0)
    embedding, qkv, norm = ag.nn.Embedding(11, 8), ag.nn.Linear(8, 24), ag.nn.LayerNorm(8)
    for module in (embedding, qkv, norm):
        module.to(device)
    params = [p for module in (embedding, qkv, norm) for p in module.parameters()]
    optimizer = ag.optim.Adam(params, lr=0.01)
    ids = np.arange(12).reshape(2, 6) % 11
    for _ in range(2):
        h = norm(F.multi_head_attention(qkv(embedding(ids)), 2, dropout_p=0.1))
        loss = F.cross_entropy(F.linear(h, embedding.weight.T), ids)
        loss.backward()
        ag.optim.clip_grad_norm(params, 1.0)
        optimizer.step()
        optimizer.zero_grad()
    assert reads == []
