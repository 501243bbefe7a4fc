"""On a GPU every read of a device value on the host makes the host wait for the GPU: a training
step of train.pretrain and train.finetune reads nothing, and a log line reads all the losses
pending since the last one at once (autograd.host_reads counts the reads, on numpy too)."""

import pytest

from autograd import host_reads
from train import finetune, lifecycle, pretrain

from .runs import examples, pretrain_into, pretrained_run, write_jsonl


@pytest.mark.parametrize("module", [pretrain, finetune], ids=["pretrain", "finetune"])
def test_a_step_reads_nothing_and_a_log_line_reads_once(corpus, tmp_path, monkeypatch, module):
    reads = {"step": 0, "log": []}
    for owner, name in [
        (module, "forward_backward"),
        (lifecycle.Training, "optimizer_step"),
        (lifecycle.LossLog, "add"),
    ]:
        monkeypatch.setattr(owner, name, counting_step(getattr(owner, name), reads))
    monkeypatch.setattr(lifecycle.LossLog, "write", counting_log(lifecycle.LossLog.write, reads))
    if module is pretrain:
        pretrain_into(corpus, tmp_path / "run", "--steps", "12", "--log-every", "4", "--eval-every", "100")
    else:
        pretrained_run(tmp_path / "pretrained")
        data = write_jsonl(tmp_path / "train.jsonl", examples(48, seed=1))
        finetune.main(
            ["--init-from", str(tmp_path / "pretrained"), "--task", "jsonl", "--train", str(data)]
            + ["--dev", str(data), "--out", str(tmp_path / "run"), "--batch-size", "4", "--epochs", "1"]
            + ["--log-every", "4", "--device", "cpu"]
        )
    assert reads["step"] == 0
    assert reads["log"] == [1, 1, 1]  # after steps 4, 8 and 12: one read for all their losses


def counting_step(function, reads):
    """`function`, adding the host reads of each call to reads["step"]."""

    def counted(*args, **kwargs):
        with host_reads.counting() as counter:
            result = function(*args, **kwargs)
        reads["step"] += counter.count
        return result

    return counted


def counting_log(write, reads):
    """LossLog.write, appending to reads["log"] the host reads of each call that had steps to log."""

    def counted(log, progress):
        pending = bool(log.pending)
        with host_reads.counting() as counter:
            write(log, progress)
        if pending:
            reads["log"].append(counter.count)

    return counted
