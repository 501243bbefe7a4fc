"""The worker processes of `prepare`: tasks run on every core, in rounds of fresh processes.

Each round's workers are forked from one server process that imported the tokenizers once at the
start (not the engine): a spawned worker would import the project again (two seconds each), and a
fork of the main process would copy its threads. The workers block Ctrl-C from birth (a terminal
sends it to every process): the main process stops them.
"""

import concurrent.futures
import contextlib
import itertools
import multiprocessing.forkserver
import multiprocessing.resource_tracker
import os
import signal
import threading

from . import SIGNALS, corpus

WORKER_BYTES = 64 << 20  # text a worker reads in one round of tasks; the next round starts fresh workers


def run_tasks(function, tasks, workers, progress, work_bytes, one_apart=False, load=lambda task: task):
    """function(load(task)) for every task, each result handed to progress(result) as it comes: in
    this process where `workers` is 1, where the tasks read less than a piece (starting a worker
    costs more), or where there is one task and not `one_apart`; else in rounds of `workers` fresh
    processes that read about WORKER_BYTES each, so that a worker's word cache and the memory it
    frees but keeps do not grow with the corpus. `load(task)`, in this process, reads what a task
    needs (a few tasks ahead of the workers, never all of them at once); `work_bytes`: what all
    the tasks read."""
    if workers == 1 or work_bytes < corpus.PIECE or (len(tasks) == 1 and not one_apart):
        for task in tasks:
            progress(function(load(task)))
        return
    size = workers * max(1, round(WORKER_BYTES * len(tasks) / work_bytes))  # tasks in a round
    for first in range(0, len(tasks), size):
        run_round(function, tasks[first : first + size], min(workers, len(tasks) - first), progress, load)


def run_round(function, tasks, workers, progress, load=lambda task: task):
    """function(load(task)) for each task in `workers` new processes, at most two tasks a worker
    handed on at a time, all stopped at the first error here or there. A worker that dies (killed,
    out of memory) ends the round with a ChildProcessError."""
    before = set(multiprocessing.active_children())
    executor = concurrent.futures.ProcessPoolExecutor(workers, start_server(), ends_with_its_parent)
    waiting = iter(tasks)
    try:
        first = [load(task) for task in itertools.islice(waiting, 2 * workers)]
        with signals_held():
            pending = {executor.submit(function, task) for task in first}  # starts the workers
        while pending:
            done, pending = concurrent.futures.wait(pending, return_when="FIRST_COMPLETED")
            for future in done:
                progress(future.result())
                if (task := next(waiting, None)) is not None:
                    pending.add(executor.submit(function, load(task)))
    except concurrent.futures.process.BrokenProcessPool:
        died = "a worker process died before its task was done (killed, or out of memory?)"
        raise ChildProcessError(f"{died}; run the same command again: it goes on from what is done") from None
    except BaseException:  # KeyboardInterrupt, mostly
        for process in set(multiprocessing.active_children()) - before:
            process.terminate()
        raise
    finally:
        executor.shutdown(cancel_futures=True)


def ends_with_its_parent():
    """A worker's first act: a thread that ends it when the main process ends, even by SIGKILL (it
    would wait for tasks forever, as it holds both ends of the pipe they come through)."""
    parent = multiprocessing.parent_process()
    threading.Thread(target=lambda: (parent.join(), os._exit(1)), daemon=True).start()


@contextlib.contextmanager
def signals_held(block=False):
    """Holds a Ctrl-C or SIGTERM until the block ends, then acts on it: a worker still starting when
    this process ends would fail, with a traceback, to open the semaphores this process took with it.
    With `block`, Ctrl-C is blocked meanwhile too: a process started within is born with it blocked."""
    held = []
    handlers = {number: signal.signal(number, lambda number, _: held.append(number)) for number in SIGNALS}
    mask = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT} if block else set())
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, mask)
        for number, handler in handlers.items():
            signal.signal(number, handler)
    for number in held:
        signal.raise_signal(number)


def start_server():
    """The multiprocessing context whose workers are forked from the server; starts the server
    where none runs (it imports in the background: call this early to have it ready). It starts
    with Ctrl-C blocked, and its workers are born as it is; one that comes meanwhile is held, not lost."""
    context = multiprocessing.get_context("forkserver")
    context.set_forkserver_preload(["train.shards", "train.workers"])  # all but the main module
    multiprocessing.resource_tracker.ensure_running()  # first: starting, it unblocks Ctrl-C here
    with signals_held(block=True):
        multiprocessing.forkserver.ensure_running()
    return context
