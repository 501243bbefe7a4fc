"""python -m train.pretrain and train.finetune with --distributed, as jobs of two ranks under
mpiexec: the same losses as one process with the same global batch, exact resume, Ctrl-C, and a
failing rank that ends the whole job. They skip where mpi4py or mpiexec is missing."""

import json
import signal
import subprocess
import time

import numpy as np
import pytest

import autograd as ag
from autograd import backend
from autograd.optim import Adam
from tinygpt import GPT, GPTConfig
from tinygpt.tokenizer import BPETokenizer
from train import finetune, pretrain
from train.checkpoint import checkpoint_steps, save_checkpoint
from train.run_folder import read_metrics, save_tokenizer, write_config

from .runs import ROOT, TIMEOUT, pretrain_argv, run_job

STEP_OF_8 = ["--batch-size", "8", "--log-every", "1"]  # SMALL's run with 8 windows a step, each step logged


def pretrain_args(corpus, out, *extra):
    return ["-m", "train.pretrain", "--distributed", *pretrain_argv(corpus, out, *STEP_OF_8, *extra)]


def records(run_dir, key):
    return [(m["step"], m[key]) for m in read_metrics(run_dir) if key in m]


def assert_close(ours, theirs, rtol=1e-5):
    """The same steps, and at each a relative difference of at most rtol."""
    assert [step for step, _ in ours] == [step for step, _ in theirs]
    for (step, a), (_, b) in zip(ours, theirs):
        assert abs(a - b) <= rtol * abs(b), f"step {step}: {a} against {b}"


COLLECTIVES = """
import numpy as np
import autograd as ag
from autograd import nn
from train import distributed

group = distributed.start(True)
ag.manual_seed(group.rank)  # different weights on each rank
layer = nn.Linear(3, 2)
group.broadcast_parameters(layer.parameters())
ag.manual_seed(0)
np.testing.assert_array_equal(layer.weight.data, nn.Linear(3, 2).weight.data)  # rank 0's
layer.weight.grad = np.full((3, 2), group.rank + 1.0, np.float32)  # 1 on rank 0, 2 on rank 1
layer.bias.grad = np.ones(2, np.float32) if group.rank == 0 else None
group.reduce_gradients(layer.parameters(), [0.25, 0.75][group.rank])
np.testing.assert_allclose(layer.weight.grad, np.full((3, 2), 0.25 * 1 + 0.75 * 2))
np.testing.assert_allclose(layer.bias.grad, np.full(2, 0.25))  # no gradient counts as zero
np.testing.assert_array_equal(group.sum([group.rank, 1]), [1, 2])
assert group.any(group.rank == 1) and not group.any(False)
group.check_same("text", b"the same everywhere")
print(f"rank {group.rank} of {group.size}: ok")
"""


def test_the_collectives_of_two_ranks(mpiexec, tmp_path):
    """Broadcast gives rank 0's weights; gradients add up with each rank's weight; sums and flags
    reach every rank."""
    script = tmp_path / "collectives.py"
    script.write_text(COLLECTIVES)
    code, output = run_job(mpiexec(2, [str(script)]), mpiexec.env)
    assert code == 0, output
    assert "rank 0 of 2: ok" in output and "rank 1" not in output  # rank 1 prints to nowhere


def test_two_ranks_log_the_losses_of_one_process(mpiexec, corpus, tmp_path):
    """Global batch 8 as 2 x 4 windows: 20 training losses and the validation losses within 1e-5 of
    one process's with batch 8, dropout on: a window's masks depend on its place in the global
    batch, not on the rank that takes it."""
    extra = ["--steps", "20", "--dropout", "0.1", "--eval-every", "10", "--lr", "1e-3"]
    pretrain.main(pretrain_args(corpus, tmp_path / "one", *extra)[3:])
    code, output = run_job(mpiexec(2, pretrain_args(corpus, tmp_path / "two", *extra)), mpiexec.env)
    assert code == 0, output
    assert "one of 2 ranks" in output
    assert len(records(tmp_path / "two", "loss")) == 20
    assert_close(records(tmp_path / "two", "loss"), records(tmp_path / "one", "loss"))
    assert_close(records(tmp_path / "two", "val_loss"), records(tmp_path / "one", "val_loss"))
    assert output.count("validation perplexity") == 1  # only rank 0 speaks


def test_two_ranks_resume_exactly_and_refuse_another_number_of_ranks(mpiexec, corpus, tmp_path, capsys):
    """With dropout on: resuming from step 6 with two ranks gives the losses of the run that went
    on; one process may not resume their checkpoint."""
    out = tmp_path / "run"
    extra = ["--steps", "12", "--save-every", "6", "--eval-every", "100"]
    code, output = run_job(mpiexec(2, pretrain_args(corpus, out, *extra)), mpiexec.env)
    assert code == 0, output
    uninterrupted = records(out, "loss")
    resume = [
        "-m",
        "train.pretrain",
        "--distributed",
        "--resume",
        str(out / "checkpoints" / "6"),
        "--device",
        "cpu",
    ]
    code, output = run_job(mpiexec(2, resume), mpiexec.env)
    assert code == 0, output
    assert records(out, "loss") == uninterrupted
    with pytest.raises(SystemExit) as stop:
        pretrain.main(["--resume", str(out / "checkpoints" / "6"), "--device", "cpu"])
    assert stop.value.code == 2
    assert "written by 2 ranks; resume it with as many (this job has 1)" in capsys.readouterr().err


def test_a_global_batch_that_does_not_split_over_the_ranks_is_refused(mpiexec, corpus, tmp_path):
    code, output = run_job(
        mpiexec(2, pretrain_args(corpus, tmp_path / "run", "--batch-size", "7")), mpiexec.env
    )
    assert code == 2
    assert "--batch-size 7 (the global batch) does not split evenly over 2 ranks" in output


def test_ctrl_c_stops_every_rank_after_saving_a_checkpoint(mpiexec, corpus, tmp_path):
    out = tmp_path / "run"
    process = subprocess.Popen(
        mpiexec(2, pretrain_args(corpus, out, "--steps", "100000", "--save-every", "100000")),
        cwd=ROOT,
        env=mpiexec.env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    deadline = time.time() + TIMEOUT
    while (
        len(records(out, "loss") if (out / "metrics.jsonl").exists() else []) < 3 and time.time() < deadline
    ):
        time.sleep(0.2)
    process.send_signal(signal.SIGINT)  # mpiexec passes Ctrl-C on to the ranks
    output, _ = process.communicate(timeout=TIMEOUT)
    assert process.returncode == 130, output
    [step] = checkpoint_steps(out)
    assert f"interrupted after step {step}" in output and "mpirun -n 2" in output
    assert [s for s, _ in records(out, "loss")] == list(range(1, step + 1))


def test_a_rank_that_fails_ends_the_job_with_its_error(mpiexec, corpus, tmp_path):
    """Rank 0 cannot write its first checkpoint (a file of the user's stands where checkpoints/
    goes, which --overwrite keeps) while rank 1 waits for it in the next step: the job ends at once
    with rank 0's message, naming the path."""
    out = tmp_path / "run"
    out.mkdir()
    (out / "checkpoints").write_text("a file of the user's")
    argv = pretrain_args(corpus, out, "--steps", "50", "--save-every", "3", "--overwrite")
    code, output = run_job(mpiexec(2, argv), mpiexec.env)
    assert code != 0 and "TIMED OUT" not in output
    failed = f"rank 0: could not write a checkpoint in {out / 'checkpoints'}: [Errno 20] Not a directory"
    assert failed in output


def test_a_rank_started_on_other_data_ends_the_job_with_its_traceback(mpiexec, corpus, tmp_path):
    other = tmp_path / "other.txt"
    other.write_text("Another text altogether. " + corpus.read_text(encoding="utf-8"), encoding="utf-8")
    out = tmp_path / "run"
    code, output = run_job(mpiexec(2, pretrain_args(corpus, out), pretrain_args(other, out)), mpiexec.env)
    assert code != 0 and "TIMED OUT" not in output
    assert "rank 1 of 2 failed" in output and "Traceback" in output
    assert "rank 1 has another command line than rank 0" in output


# ----- fine-tuning --------------------------------------------------------------------------------
WORDS = ("cat mat sat hat".split(), "dog log fog end".split())


def examples(n, seed):
    rng = np.random.default_rng(seed)
    labels = rng.integers(0, 2, n)
    return [
        json.dumps(
            {"text": " ".join(rng.choice(WORDS[label], rng.integers(2, 9))), "label": ["a", "b"][label]}
        )
        for label in labels
    ]


def test_two_ranks_fine_tune_as_one_process_with_uneven_shares(mpiexec, tmp_path):
    """65 examples in batches of 16: the texts (so the LM loss's token counts) differ in length,
    and the last batch holds one example, which leaves rank 1 nothing. Losses and dev figures stay
    within 1e-5 of one process's, dropout on (in the model and before the head)."""
    tokenizer = BPETokenizer.train([" ".join(words) for words in WORDS] * 5, vocab_size=300)
    ag.manual_seed(1)
    config = GPTConfig(
        vocab_size=tokenizer.vocab_size,
        n_ctx=24,
        n_embd=32,
        n_layer=2,
        n_head=4,
        embd_pdrop=0.1,
        attn_pdrop=0.1,
        resid_pdrop=0.1,
    )
    model = GPT(config)
    pretrained = tmp_path / "pretrained"
    pretrained.mkdir()  # the run's files first, as a run writes them: its checkpoint records their digests
    write_config(pretrained, config, {})
    save_tokenizer(tokenizer, pretrained)
    save_checkpoint(pretrained, 1, model, Adam(model.parameters()), {})
    for name, n, seed in (("train", 65, 1), ("dev", 30, 2)):
        (tmp_path / f"{name}.jsonl").write_text("\n".join(examples(n, seed)) + "\n", encoding="utf-8")
    args = [
        "--init-from",
        str(pretrained),
        "--task",
        "jsonl",
        "--train",
        str(tmp_path / "train.jsonl"),
        "--dev",
        str(tmp_path / "dev.jsonl"),
        "--lr",
        "1e-2",
        "--batch-size",
        "16",
        "--epochs",
        "2",
        "--clf-dropout",
        "0.1",
        "--device",
        "cpu",
    ]
    finetune.main([*args, "--out", str(tmp_path / "one")])
    code, output = run_job(
        mpiexec(2, ["-m", "train.finetune", "--distributed", *args, "--out", str(tmp_path / "two")]),
        mpiexec.env,
    )
    assert code == 0, output
    for key in ("loss", "objective", "lm_loss", "val_loss", "accuracy"):
        assert_close(records(tmp_path / "two", key), records(tmp_path / "one", key))
    assert len(records(tmp_path / "two", "loss")) == 10


@pytest.mark.gpu
def test_two_gpus_log_the_losses_of_one(mpiexec, corpus, tmp_path):
    """Gradients through NCCL: two ranks, each on a GPU of its own, against one GPU, dropout on."""
    if backend.cupy.cuda.runtime.getDeviceCount() < 2:
        pytest.skip("needs two CUDA devices")
    extra = ["--steps", "20", "--dropout", "0.1", "--eval-every", "10", "--lr", "1e-3"]
    one = pretrain_args(corpus, tmp_path / "one", *extra)[3:]
    pretrain.main([*one, "--device", "cuda:0"])
    code, output = run_job(
        mpiexec(2, pretrain_args(corpus, tmp_path / "two", *extra, "--device", "cuda")), mpiexec.env
    )
    assert code == 0, output
    assert "on cuda:0, one of 2 ranks" in output
    assert_close(records(tmp_path / "two", "loss"), records(tmp_path / "one", "loss"))
