import multiprocessing
import os
import signal
import subprocess
import sys
import threading
import time
from unittest import mock

import pytest

from train import corpus, workers


def task_worker_and_ctrl_c(task):
    return task, (os.getpid(), signal.SIGINT in signal.pthread_sigmask(signal.SIG_BLOCK, set()))


def test_each_round_of_tasks_worth_worker_bytes_has_fresh_workers_that_block_ctrl_c():
    done = []
    with mock.patch.object(workers, "WORKER_BYTES", corpus.PIECE):  # a task's worth: rounds of 2
        workers.run_tasks(task_worker_and_ctrl_c, range(4), 2, done.append, 4 * corpus.PIECE)
    worker = {task: pid for task, (pid, _) in done}
    assert sorted(worker) == [0, 1, 2, 3] and not {worker[0], worker[1]} & {worker[2], worker[3]}
    assert {blocked for _, (_, blocked) in done} == {True}


def test_one_worker_or_one_small_task_runs_here_and_a_task_one_apart_in_a_worker():
    done = []
    workers.run_tasks(task_worker_and_ctrl_c, range(3), 1, done.append, 10 * corpus.PIECE)
    workers.run_tasks(task_worker_and_ctrl_c, [3], 2, done.append, 10 * corpus.PIECE)
    workers.run_tasks(task_worker_and_ctrl_c, [4, 5], 2, done.append, corpus.PIECE - 1)
    assert [task for task, _ in done] == [0, 1, 2, 3, 4, 5]
    assert {pid for _, (pid, _) in done} == {os.getpid()}
    workers.run_tasks(task_worker_and_ctrl_c, [6], 2, done.append, 10 * corpus.PIECE, one_apart=True)
    assert done[-1][0] == 6 and done[-1][1][0] != os.getpid()  # the merges' memory goes back with it


def test_a_ctrl_c_while_the_workers_start_is_held_until_all_have_then_stops_them(monkeypatch):
    context, started = workers.start_server(), []
    process = context.Process

    def start_under_ctrl_c(**kwargs):
        if not started:
            os.kill(os.getpid(), signal.SIGINT)  # held: the second worker starts all the same
        started.append(process(**kwargs))
        return started[-1]

    monkeypatch.setattr(context, "Process", start_under_ctrl_c)
    with pytest.raises(KeyboardInterrupt):
        workers.run_round(time.sleep, [60, 60], 2, print)
    assert [process.exitcode for process in started] == [-signal.SIGTERM] * 2  # not slept out


def test_a_round_reads_two_tasks_a_worker_ahead_in_this_process():
    """load(task) runs here, as the workers take the tasks: never all of them at once."""
    loaded, done = [], []

    def load(task):
        loaded.append((task, len(done)))
        return task

    workers.run_round(task_worker_and_ctrl_c, range(8), 2, done.append, load)
    assert [task for task, _ in loaded] == list(range(8)) and sorted(t for t, _ in done) == list(range(8))
    assert all(done_before >= task - 4 for task, done_before in loaded)  # 2 workers, 2 tasks each
    assert os.getpid() not in {pid for _, (pid, _) in done}


def test_a_ctrl_c_while_the_server_starts_is_held_not_lost(monkeypatch):
    """The server starts with Ctrl-C blocked (its workers are born so): one that comes in that moment
    is acted on once the server is up."""
    start, started, other_thread = multiprocessing.forkserver.ensure_running, [], threading.Event()

    def under_ctrl_c():
        os.kill(os.getpid(), signal.SIGINT)  # to the other thread: this one blocks it
        time.sleep(0.1)  # its handler runs here
        start()
        started.append(True)

    monkeypatch.setattr(multiprocessing.forkserver, "ensure_running", under_ctrl_c)
    threading.Thread(target=other_thread.wait, daemon=True).start()
    try:
        with pytest.raises(KeyboardInterrupt):
            workers.start_server()
    finally:
        other_thread.set()
    assert started and signal.getsignal(signal.SIGINT) is signal.default_int_handler
    assert signal.SIGINT not in signal.pthread_sigmask(signal.SIG_BLOCK, set())


def modules_of_a_worker(_):
    return [name for name in ("train.shards", "autograd", "cupy", "ml_dtypes") if name in sys.modules]


def test_the_workers_are_born_with_the_tokenizers_and_without_the_engine():
    """Their server imported the tokenizers (train.shards) for them, and nothing more: it starts in a
    third of a second, not two and a half."""
    found = []
    workers.run_round(modules_of_a_worker, [0], 1, found.append)
    assert found == [["train.shards"]]


def task_that_dies(task):
    if task == 1:
        os.kill(os.getpid(), signal.SIGKILL)
    time.sleep(0.1 * task)


def test_a_worker_that_dies_ends_the_round_with_an_error_not_a_wait():
    with pytest.raises(ChildProcessError, match="a worker process died before its task was done"):
        workers.run_tasks(task_that_dies, range(4), 2, print, 4 * corpus.PIECE)
    assert not multiprocessing.active_children()


A_MAIN_THAT_WAITS = """
import multiprocessing, time
from train import corpus, workers
show = lambda _: print(*[process.pid for process in multiprocessing.active_children()], flush=True)
workers.run_tasks(time.sleep, [0, 600], 2, show, 2 * corpus.PIECE)
"""


def test_the_workers_end_with_the_main_process_even_when_it_is_killed():
    main = subprocess.Popen([sys.executable, "-c", A_MAIN_THAT_WAITS], stdout=subprocess.PIPE, text=True)
    pids = [int(pid) for pid in main.stdout.readline().split()]  # the first task done, the other sleeps
    main.kill()
    main.wait()
    gone_by = time.monotonic() + 30
    while any(map(running, pids)) and time.monotonic() < gone_by:
        time.sleep(0.05)
    assert len(pids) == 2 and not any(map(running, pids))


def running(pid):
    """Whether process `pid` runs (here, the workers of a killed process are nobody's to reap)."""
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rsplit(")", 1)[1].split()[0] != "Z"
    except (FileNotFoundError, ProcessLookupError):  # gone before the open, or between it and the read
        return False
