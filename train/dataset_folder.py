"""A dataset folder as train.prepare owns it: the names it writes (all it ever removes), and its
lock, which one prepare holds to write it and any number of runs hold to read it.

    manifest.json  sources.jsonl  tokenizer.json  tokenizer/  shards/<key>.bin|.idx  work/  .lock

and, while one is written, its temporary twin (`<name>.partial-<pid>`, `.tmp<pid>`). prepare
refuses, before any work, a folder that holds anything else, and never removes a name of
another form.
"""

import contextlib
import fcntl
import os
import re
import shutil

from tinygpt.weights import TOKENIZER_FILES

KEY = "[0-9a-f]{32}"  # the names of a dataset's packs: <KEY>.bin and <KEY>.idx

PARTIAL = r"(\.partial-\d+|\.tmp\d+)?"
OWN = {  # the names prepare writes, in the folder and in each folder of it
    "": re.compile(
        rf"(manifest\.json|sources\.jsonl|tokenizer\.json|\.lock){PARTIAL}|tokenizer(\.partial)?|shards|work"
    ),
    "tokenizer": re.compile(rf"({'|'.join(map(re.escape, TOKENIZER_FILES))}){PARTIAL}"),
    "shards": re.compile(rf"{KEY}\.(bin|idx|json){PARTIAL}"),  # .json: a shard of the first format
    "work": re.compile(rf"({KEY}\.(bin|json)|\d+\.json){PARTIAL}|bpe|counts"),
}
OWN["work/bpe"] = OWN["tokenizer.partial"] = OWN["tokenizer"]
OWN["work/counts"] = OWN["work"]


def foreign(folder):
    """The first path in `folder` that prepare did not write (see OWN), or None."""
    for below, pattern in OWN.items():
        where = os.path.join(folder, below) if below else folder
        if not os.path.isdir(where) or os.path.islink(where):
            if os.path.lexists(where) and below:
                return where
            continue
        for name in sorted(os.listdir(where)):
            path = os.path.join(where, name)
            nested = os.path.join(below, name) if below else name
            if (
                not pattern.fullmatch(name)
                or (os.path.isdir(path) and nested not in OWN)
                or os.path.islink(path)
            ):
                return path
    return None


def remove_own(folder):
    """Remove what prepare wrote in `folder` (--overwrite), which holds nothing else (see foreign)."""
    for name in (
        "manifest.json",
        "sources.jsonl",
        "tokenizer.json",
        "tokenizer",
        "tokenizer.partial",
        "shards",
        "work",
    ):
        path = os.path.join(folder, name)
        if os.path.isdir(path):
            shutil.rmtree(path)
        elif os.path.exists(path):
            os.remove(path)


@contextlib.contextmanager
def held(folder, wait=False):
    """Hold folder/.lock within: exclusively where no other process holds it, else shared (where
    `wait`, once the process writing it is done). Yields the processes that held it, in words, or
    None where it is held exclusively. A folder another prepare writes is an InUse naming it,
    where not `wait`."""
    with open(os.path.join(folder, ".lock"), "a") as lock:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
            others = None
        except BlockingIOError:
            others = holders(lock.name)
        if others is not None:
            try:
                fcntl.flock(lock, fcntl.LOCK_SH | (0 if wait else fcntl.LOCK_NB))
            except BlockingIOError:
                raise InUse(f"{folder}: another prepare is writing this dataset ({others})") from None
        yield others


def hold_shared(folder):
    """A shared flock on folder/.lock, held while the file it returns is open (None where the folder
    cannot hold one: read-only, with no lock file): prepare will not change the dataset meanwhile.
    A ValueError, naming it, where a prepare is writing it."""
    try:
        lock = open(os.path.join(folder, ".lock"), "a")
    except OSError:
        try:
            lock = open(os.path.join(folder, ".lock"))
        except OSError:
            return None
    try:
        fcntl.flock(lock, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except BlockingIOError:
        lock.close()
        writer = holders(os.path.join(folder, ".lock"))
        raise ValueError(
            f"{folder}: train.prepare is writing this dataset ({writer}); wait for it to end"
        ) from None
    return lock


class OutTaken(Exception):
    """--out cannot take this dataset: it holds another tokenizer's, or another process holds it."""


class InUse(OutTaken):
    """--out is held by another process: a prepare that writes it, or a run that reads it."""


def holders(path):
    """The processes whose flock holds `path`, in words (Linux's /proc/locks names them)."""
    where, found = os.stat(path), []
    with contextlib.suppress(OSError), open("/proc/locks") as locks:
        for line in locks:
            fields = line.split()
            if len(fields) < 6 or fields[1] != "FLOCK" or "->" in fields:
                continue
            major, minor, inode = fields[5].split(":")
            same = (int(major, 16), int(minor, 16), int(inode)) == (
                os.major(where.st_dev),
                os.minor(where.st_dev),
                where.st_ino,
            )
            if same and int(fields[4]) == os.getpid():
                found.append("this process, which holds it open too")
            elif same:
                found.append(f"process {fields[4]}: {command_of(fields[4])}")
    return "; ".join(found) or "a process this one cannot see"


def command_of(pid):
    """The command line of process `pid`, or "?" where it cannot be read."""
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as file:
            return " ".join(file.read().replace(b"\0", b" ").decode(errors="replace").split())[:120] or "?"
    except OSError:
        return "?"
