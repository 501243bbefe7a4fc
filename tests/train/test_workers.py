import multiprocessing
import os
import signal
from types import SimpleNamespace
from unittest import mock

import pytest

from train import corpus, workers


def task_worker_and_ctrl_c(task):
    return task, (os.getpid(), signal.getsignal(signal.SIGINT))


def test_each_round_of_tasks_worth_worker_bytes_has_fresh_workers_that_ignore_ctrl_c():
    done = []
    with mock.patch.object(workers, "WORKER_BYTES", corpus.PIECE_BYTES):  # a task's worth: rounds of 2
        workers.run_tasks(task_worker_and_ctrl_c, range(4), 2, done.append, 4 * corpus.PIECE_BYTES)
    worker = {task: pid for task, (pid, _) in done}
    assert sorted(worker) == [0, 1, 2, 3] and not {worker[0], worker[1]} & {worker[2], worker[3]}
    assert {ctrl_c for _, (_, ctrl_c) in done} == {signal.SIG_IGN}


def test_one_worker_or_one_small_task_runs_here():
    done = []
    workers.run_tasks(task_worker_and_ctrl_c, range(3), 1, done.append, 10 * corpus.PIECE_BYTES)
    workers.run_tasks(task_worker_and_ctrl_c, [3], 2, done.append, 10 * corpus.PIECE_BYTES)
    workers.run_tasks(task_worker_and_ctrl_c, [4, 5], 2, done.append, corpus.PIECE_BYTES - 1)
    assert [task for task, _ in done] == [0, 1, 2, 3, 4, 5]
    assert {pid for _, (pid, _) in done} == {os.getpid()}


def test_a_ctrl_c_while_the_workers_start_stops_them_once_all_have(monkeypatch):
    context, pools, before = workers.start_server(), [], set(multiprocessing.active_children())

    def pool_under_ctrl_c(processes):
        os.kill(os.getpid(), signal.SIGINT)  # held: the workers start all the same
        pools.append(context.Pool(processes))
        return pools[-1]

    monkeypatch.setattr(workers, "start_server", lambda: SimpleNamespace(Pool=pool_under_ctrl_c))
    with pytest.raises(KeyboardInterrupt):
        workers.started_pool(2)
    assert len(pools) == 1 and set(multiprocessing.active_children()) <= before  # stopped, and waited for
