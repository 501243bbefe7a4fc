"""autograd.threads: work cut into pieces and shared out among threads."""

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from threadpoolctl import threadpool_info, threadpool_limits

from autograd import threads


@pytest.fixture
def several_threads():
    """Run a test with several threads, then go back to the default."""
    before = threads.get_num_threads()
    threads.set_num_threads(3)
    yield 3
    threads.set_num_threads(before)


@given(n=st.integers(0, 50), size=st.integers(1, 1 << 20))
def test_blocks_and_split_cover_every_item_once(n, size):
    for pieces in (threads.blocks(n, size), threads.split(n)):
        covered = np.zeros(n, dtype=int)
        for piece in pieces:
            covered[piece] += 1
        assert (covered == 1).all()


def test_a_gpu_gets_one_piece():
    class NotNumpy:
        pass

    assert threads.blocks(100, 1, NotNumpy) == [slice(0, 100)]
    assert threads.split(100, NotNumpy) == [slice(0, 100)]


@pytest.mark.parametrize("multiplies", [False, True])
def test_for_each_does_every_piece_once_and_waits_for_all(several_threads, multiplies):
    done = np.zeros(1000)

    def work(piece):
        done[piece] += 1

    threads.for_each(work, threads.blocks(1000, 10), multiplies=multiplies)
    np.testing.assert_array_equal(done, 1)


def test_an_error_in_a_piece_reaches_the_caller(several_threads):
    def work(piece):
        if piece == 5:
            raise ValueError("piece 5")

    with pytest.raises(ValueError, match="piece 5"):
        threads.for_each(work, list(range(10)))


def test_pieces_that_run_pieces_do_them_in_place(several_threads):
    """A piece that shares out work of its own runs it itself: the pool's threads are busy, and
    waiting for them would never end."""
    total = np.zeros(8)

    def inner(piece):
        total[piece] += 1

    threads.for_each(lambda i: threads.for_each(inner, [slice(i, i + 1)] * 2), list(range(8)))
    np.testing.assert_array_equal(total, 2)


def blas_threads():
    """The thread count of each BLAS library loaded, as threadpoolctl reads it from the library."""
    return [info["num_threads"] for info in threadpool_info() if info["user_api"] == "blas"]


def test_matrix_products_in_pieces_run_with_blas_at_one_thread_then_restore_it(several_threads):
    if threads._blas is None:
        pytest.skip("threadpoolctl finds no BLAS it can set")
    a, inside = np.ones((64, 64)), []

    def multiply(rows):
        inside.append(blas_threads())
        a[rows] @ a

    def fail(piece):
        raise ValueError("a failing product")

    with threadpool_limits(limits=2, user_api="blas"):  # more than one, whatever the environment says
        threads.for_each(multiply, threads.split(64), multiplies=True)
        assert len(inside) == 3 and all(set(seen) == {1} for seen in inside)
        assert set(blas_threads()) == {2}
        with pytest.raises(ValueError, match="a failing product"):
            threads.for_each(fail, list(range(3)), multiplies=True)
        assert set(blas_threads()) == {2}


def test_thread_count_must_be_positive():
    with pytest.raises(ValueError, match="at least 1"):
        threads.set_num_threads(0)


def test_without_a_blas_to_set_products_run_one_after_another_in_the_caller(several_threads, monkeypatch):
    """numpy on another BLAS (MKL, Accelerate): pieces that multiply stay on the calling thread,
    and the products still come out right."""
    import threading

    monkeypatch.setattr(threads, "_blas", None)
    callers = set()
    threads.for_each(lambda piece: callers.add(threading.get_ident()), list(range(6)), multiplies=True)
    assert callers == {threading.get_ident()}
    a, b = np.arange(4000.0).reshape(400, 10), np.ones((10, 3000))
    np.testing.assert_allclose(threads.matmul(a, b, np.arange(3000.0)), a @ b + np.arange(3000.0))


def test_matmul_cut_into_pieces_equals_numpy(several_threads):
    rng = np.random.default_rng(0)
    a, b, bias = rng.standard_normal((300, 200)), rng.standard_normal((200, 100)), rng.standard_normal(100)
    for left, right in ((a, b), (b.T, a.T), (a[:, :50].T, a[:, 50:150])):
        np.testing.assert_allclose(threads.matmul(left, right), left @ right, rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(threads.matmul(a, b, bias), a @ b + bias, rtol=1e-12, atol=1e-12)
