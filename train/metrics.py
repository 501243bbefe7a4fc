"""The measures GLUE reports: accuracy; F1 of the positive class (MRPC); Matthews correlation
(CoLA); Pearson and Spearman correlation (STS-B). Each takes predictions and labels, in any
order-preserving sequences of equal length, and returns a float.

Where a measure is undefined (a constant input to a correlation, no positives at all for F1)
it is 0.0, as scikit-learn reports it.
"""

import numpy as np


def _pair(predictions, labels):
    predictions, labels = np.asarray(predictions), np.asarray(labels)
    if predictions.shape != labels.shape or predictions.ndim != 1:
        raise ValueError(
            f"predictions {predictions.shape} and labels {labels.shape} must be two vectors of one length"
        )
    if not len(labels):
        raise ValueError("no examples to measure")
    return predictions, labels


def accuracy(predictions, labels):
    """The fraction of predictions equal to their label."""
    predictions, labels = _pair(predictions, labels)
    return float((predictions == labels).mean())


def f1(predictions, labels, positive=1):
    """2 TP / (2 TP + FP + FN) for the positive class: the harmonic mean of precision and recall."""
    predictions, labels = _pair(predictions, labels)
    true_positives = np.sum((predictions == positive) & (labels == positive))
    wrong = np.sum((predictions == positive) != (labels == positive))
    return float(2 * true_positives / (2 * true_positives + wrong)) if true_positives + wrong else 0.0


def matthews_corrcoef(predictions, labels):
    """Matthews correlation of two labelings, from their confusion matrix C (any number of
    classes; for two it is (TP TN - FP FN) / sqrt((TP+FP)(TP+FN)(TN+FP)(TN+FN))):

        (c s - t.p) / sqrt((s^2 - p.p)(s^2 - t.t))

    with c the correct count, s the total, t and p the per-class counts of labels and predictions.
    """
    predictions, labels = _pair(predictions, labels)
    classes = np.union1d(predictions, labels)
    t = (labels[:, None] == classes).sum(axis=0).astype(np.float64)
    p = (predictions[:, None] == classes).sum(axis=0).astype(np.float64)
    c, s = float((predictions == labels).sum()), float(len(labels))
    denominator = np.sqrt((s * s - p @ p) * (s * s - t @ t))
    return float((c * s - t @ p) / denominator) if denominator else 0.0


def pearson(predictions, labels):
    """The correlation coefficient: cov(x, y) / (std(x) std(y))."""
    x, y = (a.astype(np.float64) for a in _pair(predictions, labels))
    x, y = x - x.mean(), y - y.mean()
    denominator = np.sqrt((x @ x) * (y @ y))
    return float(x @ y / denominator) if denominator else 0.0


def ranks(values):
    """1-based ranks; tied values share the mean of the ranks they span."""
    _, inverse, counts = np.unique(values, return_inverse=True, return_counts=True)
    last = np.cumsum(counts)  # the rank of the last of each group of equal values
    return (last - (counts - 1) / 2)[inverse]


def spearman(predictions, labels):
    """Pearson correlation of the ranks."""
    predictions, labels = _pair(predictions, labels)
    return pearson(ranks(predictions), ranks(labels))


METRICS = {"accuracy": accuracy, "f1": f1, "mcc": matthews_corrcoef, "pearson": pearson, "spearman": spearman}


def compute(names, predictions, labels):
    """{name: value} for each named measure (see METRICS)."""
    unknown = [name for name in names if name not in METRICS]
    if unknown:
        raise ValueError(f"unknown metrics {unknown}; choose from {', '.join(METRICS)}")
    return {name: METRICS[name](predictions, labels) for name in names}
