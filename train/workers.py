"""The worker processes of `prepare`: tasks run on every core, in rounds of fresh processes.

Each round's workers are forked from one server process that imported the project once at the
start: a spawned worker would import it all again (two seconds each), and a fork of the main
process would copy its threads. The workers ignore Ctrl-C from birth (a terminal sends it to every
process): the main process stops them.
"""

import multiprocessing.forkserver
import signal

from . import corpus
from .cli import SIGNALS

WORKER_BYTES = 64 << 20  # text a worker reads in one round of tasks; the next round starts fresh workers


def run_tasks(function, tasks, workers, progress, work_bytes, one_apart=False):
    """function(task) for every task, each result handed to progress(result) as it comes: in this
    process where `workers` is 1, where the tasks read less than a piece (starting a worker costs
    more), or where there is one task and not `one_apart`; else in rounds of `workers` fresh
    processes that read about WORKER_BYTES each, so that a worker's word cache and the memory it
    frees but keeps do not grow with the corpus. `work_bytes`: what all the tasks read."""
    if workers == 1 or work_bytes < corpus.PIECE_BYTES or (len(tasks) == 1 and not one_apart):
        for task in tasks:
            progress(function(task))
        return
    size = workers * max(1, round(WORKER_BYTES * len(tasks) / work_bytes))  # tasks in a round
    for round_of_tasks in (tasks[first : first + size] for first in range(0, len(tasks), size)):
        with started_pool(min(workers, len(round_of_tasks))) as pool:
            for result in pool.imap_unordered(function, round_of_tasks):
                progress(result)


def started_pool(workers):
    """A pool of `workers` processes. A Ctrl-C or SIGTERM while they start is held until all have,
    then acted on as it would have been: a worker still starting when this process ends would
    fail, with a traceback, to open the semaphores this process took with it."""
    context, held = start_server(), []
    handlers = {number: signal.signal(number, lambda number, _: held.append(number)) for number in SIGNALS}
    try:
        pool = context.Pool(workers)
    finally:
        for number, handler in handlers.items():
            signal.signal(number, handler)
    try:
        for number in held:
            signal.raise_signal(number)
    except BaseException:  # KeyboardInterrupt, mostly
        pool.terminate()
        raise
    return pool


def start_server():
    """The multiprocessing context whose workers are forked from the server; starts the server
    where none runs (it imports in the background: call this early to have it ready). It starts
    with Ctrl-C ignored, and its workers are born as it is."""
    context = multiprocessing.get_context("forkserver")
    context.set_forkserver_preload(["train.shards"])  # what tasks need: all but the main module
    handler = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        multiprocessing.forkserver.ensure_running()
    finally:
        signal.signal(signal.SIGINT, handler)
    return context
