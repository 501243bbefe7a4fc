"""python -m train.prepare: a corpus as it ships -> a dataset folder that train.pretrain memory-maps.

Text files, JSON lines and Parquet, compressed or not (train/sources.py), on every core and in
bounded memory: each file is cut into chunks (train/corpus.py); --workers processes count their words
(for a BPE trained here) and encode them, a task of chunks each; the ids are joined into packs of
many documents (train/packs.py). A Ctrl-C, a kill or a crash loses only the tasks under way: the same
command again goes on from what is done, and after files are added, removed or edited it encodes
only the packs they fall in. prepare writes and removes only its own files (train/dataset_folder.py).
"""

import argparse
import contextlib
import glob
import hashlib
import json
import os
import shutil
import signal
import tempfile
import time
import warnings
from collections import Counter

import numpy as np

from tinygpt.files import UndecodableFiles, write_whole
from tinygpt.tokenizer import GPT1Tokenizer, load_tokenizer

from . import (
    cli,
    corpus,
    data,
    dataset,
    dataset_folder,
    dataset_tokenizer,
    packs,
    plan,
    shards,
    sources,
    workers,
)
from .cli import add_text_arguments, positive_int
from .dataset_folder import OutTaken
from .lifecycle import flags_given
from .progress import Progress
from .run_folder import is_run


def command_line():
    parts = {"data": add_data_arguments, "tokenizer": add_tokenizer_arguments, "the work": add_work_arguments}
    return cli.grouped_parser("python -m train.prepare", __doc__, parts)


def parse_args(argv):
    parser = command_line()
    args = parser.parse_args(argv)
    given = flags_given(parser, args)
    if args.tokenizer and args.gpt1_tokenizer:
        parser.error("give --tokenizer or --gpt1-tokenizer, not both")
    for flag in ("normalize", "vocab_size", "tokenizer_sample"):
        if flag in given and (args.tokenizer or args.gpt1_tokenizer):
            name = "--tokenizer" if args.tokenizer else "--gpt1-tokenizer"
            parser.error(f"--{flag.replace('_', '-')} is for a tokenizer trained here, not with {name}")
    if os.path.exists(args.out) and not os.path.isdir(args.out):
        parser.error(f"--out: {args.out} is a file; name a folder (made, or gone on with)")
    if is_run(args.out):
        parser.error(f"--out: {args.out} is a run's folder: choose another")
    for path in args.data:
        if os.path.isdir(path) and dataset.is_dataset(path):
            train = f"train on it with python -m train.pretrain --data {path}"
            parser.error(
                f"--data: {path} is a dataset train.prepare wrote: {train}, or give prepare its text"
            )
    args.json_key_given = "json_key" in given
    cli.check_writable(parser, "--out", args.out)
    read = [m for p in args.data for m in (glob.glob(p) if any(c in p for c in "*?[") else [p])]
    read = [m for m in read if not (os.path.isdir(m) and dataset.is_dataset(m))]  # never read: skipped
    cli.check_apart_from_inputs(parser, "--out", args.out, argparse.Namespace(**{**vars(args), "data": read}))
    if os.path.isdir(args.out) and (path := dataset_folder.foreign(args.out)):
        parser.error(
            f"--out: {args.out} holds {path}, which prepare did not write: choose a new or empty folder"
        )
    return parser, args


def add_data_arguments(group):
    what = "text, JSON lines or Parquet files (compressed or not), folders of them, globs"
    group.add_argument("--data", nargs="+", required=True, type=cli.path, metavar="PATH", help=what)
    group.add_argument("--out", required=True, type=cli.path, metavar="DIR", help="the dataset's folder")
    endings = "the endings of the files read below a folder (each also as .gz, .bz2, .xz, .zst)"
    group.add_argument("--extensions", nargs="+", default=list(sources.EXTENSIONS), help=endings)
    documents = (
        "files: each text file is one document (books stay whole); paragraphs: a blank line ends one too"
    )
    group.add_argument("--documents", choices=["files", "paragraphs"], default="files", help=documents)
    key = "the field of a JSON record (the column of a Parquet file) that holds its text"
    group.add_argument("--json-key", type=cli.text, default="text", help=key)
    group.add_argument("--val-fraction", type=cli.held_out, default=0.05, help="share of documents held out")
    add_text_arguments(group)


def add_tokenizer_arguments(group):
    group.add_argument("--tokenizer", help="a saved BPE tokenizer folder (default: one trained here)")
    group.add_argument("--gpt1-tokenizer", help="GPT-1's folder of encoder_bpe_40000.json, vocab_40000.bpe")
    size = f"of a tokenizer trained here (default: {dataset_tokenizer.DEFAULT_VOCAB})"
    group.add_argument("--vocab-size", type=cli.vocab_size, help=size)
    group.add_argument("--normalize", choices=["gpt1"], help="a BPE trained here sees text as GPT-1's did")
    sample = "train the BPE on an even sample of about this many bytes of the corpus (default: all of it)"
    group.add_argument("--tokenizer-sample", type=positive_int, metavar="BYTES", help=sample)


def add_work_arguments(group):
    cores = len(os.sched_getaffinity(0))
    group.add_argument("--workers", type=positive_int, default=cores, help="processes, one a core by default")
    group.add_argument("--overwrite", action="store_true", help="start --out afresh (another tokenizer)")
    verify = "hash every file again, however unchanged its size and times (and every pack: always)"
    group.add_argument("--verify", action="store_true", help=verify)


def given_tokenizer(args):
    """The tokenizer --tokenizer or --gpt1-tokenizer names."""
    return (
        load_tokenizer(args.tokenizer) if args.tokenizer else GPT1Tokenizer.from_folder(args.gpt1_tokenizer)
    )


def encode(args, planned, loader, reading, tokenizer, dtype):
    """Encode every pack that is not whole in --out/shards, task by task, joining each pack as soon
    as it and those before it are done (a task's output is removed once no pack ahead needs it: two
    files of the same bytes make tasks of one key); returns the manifest's record of every pack."""
    folder, work = os.path.join(args.out, "shards"), os.path.join(args.out, "work")
    os.makedirs(folder, exist_ok=True)
    os.makedirs(work, exist_ok=True)
    kept, todo, wanted = set(), {}, Counter()
    for pack in planned:
        problem = packs.pack_problem(folder, pack.key, dtype.itemsize)
        if problem not in (None, "missing"):
            print(f"{os.path.join(folder, pack.key)}.bin: damaged ({problem}); writing it again")
        if problem:
            todo |= {task.key: task for task in packs.tasks_to_do(pack, work)}
            wanted.update(task.key for task in pack.tasks)
        else:
            kept.add(pack.key)
    waiting, records, carried = set(todo), [], None

    def join_ready():
        nonlocal carried
        while len(records) < len(planned) and not waiting & {t.key for t in planned[len(records)].tasks}:
            pack = planned[len(records)]
            if pack.key in kept:
                records.append(packs.pack_record(folder, pack.key))
                carried = packs.last_digest(folder, pack.key)
                continue
            record, carried = packs.write_pack(pack, work, folder, carried)
            records.append(record)
            wanted.subtract(task.key for task in pack.tasks)
            for key in {task.key for task in pack.tasks if not wanted[task.key]}:
                os.remove(os.path.join(work, f"{key}.json"))
                os.remove(os.path.join(work, f"{key}.bin"))

    def done(result):
        key, read = result
        waiting.discard(key)
        progress.update(read)
        join_ready()

    tokenizer_at = (os.path.join(args.out, "tokenizer"), data.tokenizer_fingerprint(tokenizer))
    job = lambda task: (loader.items(task), reading, tokenizer_at, dtype.name, work, task.key)  # noqa: E731
    progress = Progress("encoding", sum(task.size for task in todo.values()), "B")
    join_ready()
    workers.run_tasks(shards.encode_task, list(todo.values()), args.workers, done, progress.total, load=job)
    progress.close()
    return records


def manifest_of(args, records, tokenizer, dtype, sources_digest):
    """The manifest of a dataset: its settings, the packs' records in order, the sources' digest."""
    settings = {
        name: getattr(args, name) for name in ("val_fraction", "documents", "encoding", "errors", "json_key")
    }
    manifest = {
        "format": dataset.FORMAT,
        "tokenizer": data.tokenizer_fingerprint(tokenizer),
        "dtype": dtype.name,
    }
    return manifest | settings | {"packs": records, "sources": sources_digest}


def write_manifest(args, records, tokenizer, dtype, sources_digest):
    """Write manifest.json (whole, or not at all), then remove the packs it does not name and the work."""
    manifest = manifest_of(args, records, tokenizer, dtype, sources_digest)
    write_whole(os.path.join(args.out, dataset.MANIFEST), json.dumps(manifest).encode())
    named = {f"{record['key']}{suffix}" for record in records for suffix in (".bin", ".idx")}
    folder = os.path.join(args.out, "shards")
    for name in os.listdir(folder):
        if name not in named and dataset_folder.OWN["shards"].fullmatch(name):
            os.remove(os.path.join(folder, name))
    shutil.rmtree(os.path.join(args.out, "work"), ignore_errors=True)
    return manifest


def check_unchanged(records):
    """A ValueError naming a file that changed or vanished while it was read."""
    for record in records:
        try:
            now = sources.identity_of(os.stat(record["path"]))
        except FileNotFoundError:
            now = None
        if now != record["stat"]:
            how = "vanished" if now is None else "changed"
            raise ValueError(f"{record['path']}: {how} while it was prepared; run the same command again")


def is_current(manifest, args, planned, tokenizer, dtype):
    """Whether the dataset holds already what prepare would write: a manifest of the same settings
    and of the packs planned, each whole."""
    folder = os.path.join(args.out, "shards")
    if not manifest or any(packs.pack_problem(folder, pack.key, dtype.itemsize) for pack in planned):
        return False
    records = [packs.pack_record(folder, pack.key) for pack in planned]
    return manifest == manifest_of(args, records, tokenizer, dtype, manifest.get("sources"))


def make_dataset(args, wait=False, given=None):
    """Prepare the files of args.data into the dataset folder args.out, with prepare's settings
    (args: its flags) and the tokenizer `given` if one is; returns the manifest. `wait`: for another
    process preparing the same folder, and then take its dataset as it is, if it is this one."""
    found, skipped = sources.find_sources(args.data, tuple(args.extensions))
    if not found:
        report_skipped(skipped)
        raise ValueError(f"no files to read in {' '.join(map(str, args.data))}")
    if getattr(args, "json_key_given", False) and all(source.format == "text" for source in found):
        raise ValueError(
            "--json-key is for JSON lines and Parquet files, and the corpus holds text files alone"
        )
    os.makedirs(args.out, exist_ok=True)
    if args.workers > 1:
        workers.start_server()  # it imports while this process reads the files
    with (
        dataset_folder.held(args.out, wait) as others,
        contextlib.closing(plan.Loader([], args.json_key)) as loader,
    ):
        if args.overwrite and others is None:
            dataset_folder.remove_own(args.out)
        cuts = corpus.cuts_of(given) if given else "lines" if args.normalize else "words"
        previous = plan.read_records(args.out)
        records, settings, problems = plan.plan(args, found, previous, cuts)
        report_skipped(skipped + [(record["path"], "empty") for record in records if record["blank"]])
        if problems:
            raise UndecodableFiles(problems)
        if all(record["blank"] for record in records):
            raise ValueError(f"the corpus in {' '.join(map(str, args.data))} is empty")
        reading = shards.Reading(
            args.encoding, args.errors, args.documents == "paragraphs", args.json_key, cuts
        )
        units, loader.records = plan.units_of(records, reading), records
        request = dataset_tokenizer.request_of(args, given)
        tokenizer = None if args.overwrite else dataset_tokenizer.kept(args, request)
        manifest = dataset.read_manifest(args.out)
        if tokenizer and manifest:
            dtype = np.dtype("uint16" if tokenizer.vocab_size <= 2**16 else "uint32")
            planned = packs.plan_packs(units, [data.tokenizer_fingerprint(tokenizer), dtype.name])
            if is_current(manifest, args, planned, tokenizer, dtype):
                if others is None and previous[2] != plan.records_digest(records):  # new times, or damage
                    manifest["sources"] = plan.write_records(args.out, records, settings)
                    write_whole(os.path.join(args.out, dataset.MANIFEST), json.dumps(manifest).encode())
                print(f"{args.out}: up to date, nothing to encode")
                return manifest
        if others is not None:
            raise dataset_folder.InUse(f"{args.out}: a run reads this dataset ({others})")
        sources_digest = plan.write_records(args.out, records, settings)
        if tokenizer is None:
            tokenizer = given or dataset_tokenizer.trained(args, units, loader, reading)
            dataset_tokenizer.save(args, tokenizer, request)
        dtype = np.dtype("uint16" if tokenizer.vocab_size <= 2**16 else "uint32")
        planned = packs.plan_packs(units, [data.tokenizer_fingerprint(tokenizer), dtype.name])
        pack_records = encode(args, planned, loader, reading, tokenizer, dtype)
        check_unchanged(records)
        return write_manifest(args, pack_records, tokenizer, dtype, sources_digest)


def report_skipped(skipped):
    """Name the files not read, twenty at most."""
    for path, why in sorted(skipped)[:20]:
        print(f"not read: {path} ({why})")
    if len(skipped) > 20:
        print(f"not read: {len(skipped) - 20:,} more files")


def summary(manifest, folder, seconds):
    """The closing lines: documents and tokens in each split, the packs, the time."""
    counts = {"train": [0, 0], "val": [0, 0]}
    threshold = np.uint64(min(int(manifest["val_fraction"] * 2**64), 2**64 - 1))
    for pack in manifest["packs"]:
        ends, begins, digests = dataset.read_index(os.path.join(folder, "shards", f"{pack['key']}.idx"))
        sizes = np.diff(np.concatenate([[0], ends]))
        for split, mask in (("train", digests >= threshold), ("val", digests < threshold)):
            counts[split][0] += int(begins[mask].sum())
            counts[split][1] += int(sizes[mask].sum())
    for split, (documents, tokens) in counts.items():
        print(f"{split}: {documents:,} documents, {tokens:,} tokens")
    if not counts["val"][0]:
        print("no document is held out: pretrain will hold out the end of the training tokens (for a split")
        print("by content, --documents paragraphs, more files or a larger --val-fraction)")
    written = f"{len(manifest['packs']):,} pack{'s' * (len(manifest['packs']) != 1)}"
    print(f"{written} of {manifest['dtype']} ids, in {seconds:.1f} s")


def of_text(paths, args, given=None):
    """The dataset folder of text files, folders or globs given to train.pretrain (args: its flags),
    prepared into the cache (TINYGPT_CACHE/datasets/, named by a hash of the paths and settings) as
    prepare prepares one: a later run on the same text reuses its tokenizer and ids, and ranks of
    one machine share it. A cache that cannot be written costs a warning: a temporary folder serves."""
    request = data.tokenizer_fingerprint(given) if given else [args.vocab_size, args.normalize]
    paths = [os.path.abspath(path) for path in paths]
    key = json.dumps([paths, request, args.encoding, args.errors, args.val_fraction])
    out = os.path.join(data.cache_dir(), "datasets", hashlib.sha256(key.encode()).hexdigest()[:32])
    settings = command_line().parse_args(["--data", *paths, f"--out={out}"])  # prepare's defaults
    for name in ("val_fraction", "encoding", "errors", "vocab_size", "normalize"):
        setattr(settings, name, getattr(args, name))
    stop = signal.signal(signal.SIGTERM, signal.default_int_handler)  # as prepare's: the workers stopped
    try:
        os.makedirs(settings.out, exist_ok=True)
        open(os.path.join(settings.out, ".lock"), "a").close()
        try:
            make_dataset(settings, wait=True, given=given)
        except dataset_folder.InUse as error:  # a run reads the cached dataset of this text, since changed
            raise ValueError(f"{error}, and the text has changed since: wait for it to end") from None
        except OutTaken:  # a cache folder changed by hand: it is only a cache
            settings.overwrite = True
            make_dataset(settings, wait=True, given=given)
    except OSError as error:
        if not os.path.realpath(getattr(error, "filename", None) or "/").startswith(
            os.path.realpath(data.cache_dir())
        ):
            raise
        reason = f"cannot prepare the text there ({error.strerror}); using a temporary folder"
        warnings.warn(f"{settings.out}: {reason}", stacklevel=2)
        settings.out, settings.overwrite = tempfile.mkdtemp(prefix="tinygpt-data-"), False
        cli.on_return(shutil.rmtree, settings.out, True)
        make_dataset(settings, wait=True, given=given)
    finally:
        signal.signal(signal.SIGTERM, stop)
    return settings.out


@contextlib.contextmanager
def writing_out(parser, out):
    """Around prepare's work: an OSError of a file in --out (a full disk) is one line naming --out."""
    try:
        yield
    except OSError as error:
        inside = error.filename and os.path.realpath(error.filename).startswith(
            os.path.realpath(out) + os.sep
        )
        if not inside or not error.strerror:
            raise
        parser.exit(1, cli.shown(f"{parser.prog}: error: --out: {error.filename}: {error.strerror}\n"))


@cli.command(parse_args)
def main(parser, args):
    began = time.monotonic()
    signal.signal(signal.SIGTERM, signal.default_int_handler)  # a kill stops the workers as Ctrl-C does
    flag = "--tokenizer" if args.tokenizer else "--gpt1-tokenizer"
    with cli.reading(parser, flag):  # before any reading of the corpus
        given = (args.tokenizer or args.gpt1_tokenizer) and given_tokenizer(args)
    try:
        with cli.reading(parser, "--data"), writing_out(parser, args.out):
            manifest = make_dataset(args, given=given)
    except dataset_folder.InUse as error:
        parser.error(f"--out: {error}; wait for it to end, or choose another --out")
    except OutTaken as error:
        parser.error(f"--out: {error}")
    summary(manifest, args.out, time.monotonic() - began)
    print(f"dataset: {args.out} (train on it: python -m train.pretrain --data {args.out})")


if __name__ == "__main__":
    main()
