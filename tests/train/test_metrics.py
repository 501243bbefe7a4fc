"""The GLUE measures against hand-computed values, and the properties that define them."""

import numpy as np
import pytest
from hypothesis import assume, given
from hypothesis import strategies as st

from train.metrics import accuracy, compute, f1, matthews_corrcoef, pearson, ranks, spearman

classes = st.lists(st.tuples(st.integers(0, 2), st.integers(0, 2)), min_size=1, max_size=40)
binary = st.lists(st.tuples(st.integers(0, 1), st.integers(0, 1)), min_size=1, max_size=40)
numbers = st.lists(st.tuples(st.floats(-100, 100), st.floats(-100, 100)), min_size=2, max_size=40)


def columns(pairs):
    return np.array([p for p, _ in pairs]), np.array([y for _, y in pairs])


# ----- by hand -------------------------------------------------------------------------------
def test_accuracy_by_hand():
    assert accuracy([1, 0, 1, 1], [1, 1, 1, 0]) == 0.5
    assert accuracy(["a", "b"], ["a", "b"]) == 1.0


def test_f1_by_hand():
    # TP = 2 (first, last), FP = 1 (second), FN = 1 (fourth): 2*2 / (2*2 + 1 + 1)
    assert f1([1, 1, 0, 0, 1], [1, 0, 0, 1, 1]) == pytest.approx(4 / 6)
    assert f1([0, 0, 0], [0, 0, 0]) == 0.0  # no positives at all: undefined, reported as 0
    assert f1(["yes", "no"], ["yes", "yes"], positive="yes") == pytest.approx(2 / 3)


def test_matthews_by_hand():
    # TP = 3, FN = 1, FP = 1, TN = 3: (9 - 1) / sqrt(4 * 4 * 4 * 4)
    assert matthews_corrcoef([1, 1, 0, 0, 0, 1, 0, 1], [1, 1, 1, 0, 0, 0, 0, 1]) == pytest.approx(0.5)
    # scikit-learn's documented example, with -1/+1 labels: TP = 2, FN = 1, FP = 1, TN = 0
    assert matthews_corrcoef([1, -1, 1, 1], [1, 1, 1, -1]) == pytest.approx(-1 / 3)
    assert matthews_corrcoef([1, 1, 1], [0, 1, 0]) == 0.0  # constant predictions: undefined, 0
    # three classes, every one wrong in a cycle: c = 0, s = 3, t = p = (1, 1, 1): -3 / sqrt(6 * 6)
    assert matthews_corrcoef([1, 2, 0], [0, 1, 2]) == pytest.approx(-0.5)


def test_pearson_by_hand():
    # deviations (-1, 0, 1) and (-7/3, -1/3, 8/3): covariance sum 5, squares 2 and 114/9
    assert pearson([1, 2, 3], [2, 4, 7]) == pytest.approx(5 / np.sqrt(2 * 114 / 9))
    assert pearson([1, 2, 3], [3, 2, 1]) == pytest.approx(-1)
    assert pearson([1, 1, 1], [1, 2, 3]) == 0.0  # a constant: undefined, 0


def test_ranks_and_spearman_by_hand():
    assert ranks([10, 30, 20, 20]).tolist() == [1, 4, 2.5, 2.5]
    # ranks (1, 2.5, 2.5, 4) and (1, 2, 3, 4): deviations (-1.5, 0, 0, 1.5), (-1.5, -.5, .5, 1.5)
    assert spearman([1, 2, 2, 3], [10, 20, 30, 40]) == pytest.approx(4.5 / np.sqrt(4.5 * 5))
    assert spearman([1, 2, 3, 4], [1, 8, 27, 1000]) == pytest.approx(1)


def test_compute_names_its_measures_and_refuses_bad_input():
    # TP = 2, TN = 1, FP = 1, FN = 0
    assert compute(["accuracy", "f1", "mcc"], [1, 0, 1, 1], [1, 0, 0, 1]) == {
        "accuracy": 0.75,
        "f1": pytest.approx(0.8),
        "mcc": pytest.approx(2 / np.sqrt(3 * 2 * 2 * 1)),
    }
    with pytest.raises(ValueError, match="unknown metrics"):
        compute(["bleu"], [1], [1])
    with pytest.raises(ValueError, match="one length"):
        accuracy([1, 0], [1])
    with pytest.raises(ValueError, match="no examples"):
        pearson([], [])


# ----- properties ----------------------------------------------------------------------------
@given(classes)
def test_accuracy_counts_agreements(pairs):
    predictions, labels = columns(pairs)
    assert accuracy(predictions, labels) == sum(p == y for p, y in pairs) / len(pairs)


@given(binary)
def test_binary_matthews_is_the_textbook_formula(pairs):
    predictions, labels = columns(pairs)
    tp = sum(p == 1 and y == 1 for p, y in pairs)
    tn = sum(p == 0 and y == 0 for p, y in pairs)
    fp = sum(p == 1 and y == 0 for p, y in pairs)
    fn = sum(p == 0 and y == 1 for p, y in pairs)
    denominator = np.sqrt(float((tp + fp) * (tp + fn) * (tn + fp) * (tn + fn)))
    expected = (tp * tn - fp * fn) / denominator if denominator else 0.0
    assert matthews_corrcoef(predictions, labels) == pytest.approx(expected, abs=1e-12)


@given(classes)
def test_matthews_is_one_for_perfect_predictions_and_symmetric(pairs):
    predictions, labels = columns(pairs)
    assert matthews_corrcoef(predictions, labels) == pytest.approx(matthews_corrcoef(labels, predictions))
    assume(len(set(labels)) > 1)
    assert matthews_corrcoef(labels, labels) == pytest.approx(1)


@given(binary)
def test_f1_is_the_harmonic_mean_of_precision_and_recall(pairs):
    predictions, labels = columns(pairs)
    tp = np.sum((predictions == 1) & (labels == 1))
    assume(tp > 0)
    precision, recall = tp / np.sum(predictions == 1), tp / np.sum(labels == 1)
    assert f1(predictions, labels) == pytest.approx(2 * precision * recall / (precision + recall))


@given(numbers, st.floats(0.1, 10), st.floats(-10, 10))
def test_pearson_agrees_with_numpy_and_ignores_scale_and_shift(pairs, scale, shift):
    x, y = columns(pairs)
    assume(np.ptp(x) > 1e-3 and np.ptp(y) > 1e-3)
    assert pearson(x, y) == pytest.approx(np.corrcoef(x, y)[0, 1], abs=1e-9)
    assert pearson(x * scale + shift, y) == pytest.approx(pearson(x, y), abs=1e-9)
    assert pearson(-x, y) == pytest.approx(-pearson(x, y), abs=1e-9)


@given(numbers)
def test_spearman_ignores_any_increasing_transformation(pairs):
    x, y = columns(pairs)
    assume(np.ptp(x) > 0 and np.ptp(y) > 0)
    assert spearman(np.cbrt(x) + x, y) == pytest.approx(spearman(x, y), abs=1e-12)
    assert spearman(x, x) == pytest.approx(1)
    assert -1 - 1e-12 <= spearman(x, y) <= 1 + 1e-12


@given(st.lists(st.integers(-5, 5), min_size=1, max_size=30))
def test_ranks_sum_like_1_to_n_and_follow_the_order(values):
    r = ranks(values)
    assert r.sum() == pytest.approx(len(values) * (len(values) + 1) / 2)
    for i in range(len(values)):
        for j in range(len(values)):
            assert (values[i] < values[j]) == (r[i] < r[j])
