"""A task head on a dataset: its predictions, the task's metrics, and predictions.tsv."""

import numpy as np

import autograd as ag

from . import metrics

MAIN_METRIC = {"mrpc": "f1"}  # the paper's figure for MRPC; other tasks rank runs by their first metric


def main_metric(dataset):
    """The metric that picks the best epoch of a fine-tune on `dataset` (a train.glue.Dataset)."""
    return MAIN_METRIC.get(dataset.task, dataset.metrics[0])


@ag.no_grad()
def predict(head, data, batch_size):
    """(predictions in the order of the examples, mean task loss) of a head on a TaskData, with
    dropout off; the head is left in the mode it was in."""
    was_training = head.training
    head.eval()
    predictions, total = [], 0.0
    for batch in data.batches(batch_size):
        logits, _ = head(batch.ids, batch.clf_positions, lm=False)
        predictions.append(head.predict(logits))
        total += float(head.task_loss(logits, batch.labels).item()) * len(batch.labels)
    head.train(was_training)
    return np.concatenate(predictions), total / len(data)


def evaluate(head, data, metric_names, batch_size):
    """(predictions, {"loss": mean task loss, metric: value, ...}) of a head on a TaskData."""
    predictions, loss = predict(head, data, batch_size)
    return predictions, {"loss": loss, **metrics.compute(metric_names, predictions, data.labels)}


def write_predictions(path, predictions, dataset):
    """predictions.tsv: `index<TAB>prediction` per example, the prediction written as the dataset
    writes its labels: a label name, a score, or the chosen answer (for rocstories numbered from 1,
    as its AnswerRightEnding column; for jsonl the index into choices)."""

    def label(value):
        if dataset.labels is not None:
            return dataset.labels[int(value)]
        if dataset.kind == "multiple_choice":
            return int(value) + (dataset.task == "rocstories")
        return f"{float(value):.4f}"

    with open(path, "w", encoding="utf-8") as f:
        f.write("index\tprediction\n")
        f.writelines(f"{i}\t{label(value)}\n" for i, value in enumerate(predictions))
