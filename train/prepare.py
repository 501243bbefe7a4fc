"""python -m train.prepare: text files -> a dataset folder that train.pretrain memory-maps.

On every core, in bounded memory: --workers processes count the words (for a BPE trained here)
and encode the corpus, a chunk of a file each at a time; no file is read whole. A Ctrl-C, a kill
or a crash loses only the chunks under way: the same command again goes on from the finished
shards, and after files are added, removed or edited it encodes only theirs.
"""

import contextlib
import fcntl
import hashlib
import json
import os
import shutil
import signal
import tempfile
import time
import warnings

import numpy as np

from tinygpt.files import UndecodableFiles, read_json, write_whole
from tinygpt.tokenizer import GPT1Tokenizer, load_tokenizer

from . import cli, corpus, data, dataset, shards, workers
from .cli import add_text_arguments, positive_int
from .progress import Progress
from .run_folder import is_run


def command_line():
    parts = {"data": add_data_arguments, "tokenizer": add_tokenizer_arguments, "the work": add_work_arguments}
    return cli.grouped_parser("python -m train.prepare", __doc__, parts)


def parse_args(argv):
    parser = command_line()
    args = parser.parse_args(argv)
    if args.tokenizer and args.gpt1_tokenizer:
        parser.error("give --tokenizer or --gpt1-tokenizer, not both")
    if args.normalize and (args.tokenizer or args.gpt1_tokenizer):
        parser.error("--normalize is for a tokenizer trained here, not with --tokenizer or --gpt1-tokenizer")
    if os.path.exists(args.out) and not os.path.isdir(args.out):
        parser.error(f"--out: {args.out} is a file; name a folder (made, or gone on with)")
    if is_run(args.out):
        parser.error(f"--out: {args.out} is a run's folder: choose another")
    cli.check_writable(parser, "--out", args.out)
    cli.check_apart_from_inputs(parser, "--out", args.out, args)
    return parser, args


def add_data_arguments(group):
    group.add_argument("--data", nargs="+", required=True, metavar="PATH", help="text files, folders, globs")
    out = "the dataset's folder (new or gone on with)"
    group.add_argument("--out", required=True, metavar="DIR", help=out)
    endings = "the endings of the files read below a folder"
    group.add_argument("--extensions", nargs="+", default=[".txt"], help=endings)
    documents = "files: each file is one document (books stay whole); paragraphs: a blank line ends one too"
    group.add_argument("--documents", choices=["files", "paragraphs"], default="files", help=documents)
    group.add_argument("--val-fraction", type=cli.held_out, default=0.05, help="share of documents held out")
    add_text_arguments(group)


def add_tokenizer_arguments(group):
    group.add_argument("--tokenizer", help="a saved BPE tokenizer folder (default: one trained here)")
    group.add_argument("--gpt1-tokenizer", help="GPT-1's folder of encoder_bpe_40000.json, vocab_40000.bpe")
    group.add_argument("--vocab-size", type=cli.vocab_size, default=2048, help="of a tokenizer trained here")
    group.add_argument("--normalize", choices=["gpt1"], help="a BPE trained here sees text as GPT-1's did")
    sample = "train the BPE on an even sample of about this many bytes of the corpus (default: all of it)"
    group.add_argument("--tokenizer-sample", type=positive_int, metavar="BYTES", help=sample)


def add_work_arguments(group):
    cores = len(os.sched_getaffinity(0))
    group.add_argument("--workers", type=positive_int, default=cores, help="processes, one a core by default")
    group.add_argument("--overwrite", action="store_true", help="start --out afresh (another tokenizer)")


def plan(args, files, previous):
    """{path: its record}: size, time, SHA-256 and chunks, read again only where the size or the
    time differs from the previous manifest's (or the settings that cut chunks)."""
    known = {source["path"]: source for source in (previous or {}).get("sources", [])}
    cut_by = ("encoding", "documents")
    same_cuts = previous and [previous.get(k) for k in cut_by] == [getattr(args, k) for k in cut_by]
    records, todo = {}, []
    for path in files:
        stat = os.stat(path)
        record = {"path": path, "size": stat.st_size, "mtime_ns": stat.st_mtime_ns}
        old = known.get(path)
        if same_cuts and old and (old["size"], old["mtime_ns"]) == (stat.st_size, stat.st_mtime_ns):
            records[path] = {**record, "sha256": old["sha256"], "chunks": old["chunks"]}
        else:
            records[path], todo = record, todo + [path]
    progress, problems = Progress("reading", sum(records[path]["size"] for path in todo), "B"), []
    for path in todo:
        paragraphs = args.documents == "paragraphs"
        digest, chunks, problem = corpus.plan_chunks(
            path, args.encoding, paragraphs, progress.update, args.errors
        )
        records[path].update(sha256=digest, chunks=[list(chunk) for chunk in chunks])
        problems += [problem] if problem else []
    progress.close()
    if problems:
        raise UndecodableFiles(problems)
    return records


def given_tokenizer(args):
    """The tokenizer --tokenizer or --gpt1-tokenizer names."""
    return (
        load_tokenizer(args.tokenizer) if args.tokenizer else GPT1Tokenizer.from_folder(args.gpt1_tokenizer)
    )


def build_tokenizer(args, records, given=None):
    """The dataset's tokenizer (saved in --out/tokenizer before any encoding): the one `given` or
    named by the flags, the one --out holds already for the same request, or a BPE trained on the
    corpus."""
    folder, request_path = os.path.join(args.out, "tokenizer"), os.path.join(args.out, "tokenizer.json")
    given = given or ((args.tokenizer or args.gpt1_tokenizer) and given_tokenizer(args))
    trained = {"vocab_size": args.vocab_size, "normalizer": args.normalize, "sample": args.tokenizer_sample}
    request = {"fingerprint": data.tokenizer_fingerprint(given)} if given else trained
    if os.path.isfile(request_path):
        held = read_json(request_path)
        if isinstance(held, dict) and held.get("request") == request:
            return load_tokenizer(folder)
        raise OutTaken(
            f"{args.out} holds the dataset of another tokenizer ({describe(held)}); "
            "pass --overwrite to start it afresh, or another --out"
        )
    tokenizer = given or train_tokenizer(args, records)
    shutil.rmtree(folder + ".partial", ignore_errors=True)
    tokenizer.save(folder + ".partial")
    shutil.rmtree(folder, ignore_errors=True)
    os.replace(folder + ".partial", folder)
    write_whole(request_path, json.dumps({"request": request}).encode())
    return tokenizer


def describe(held):
    """tokenizer.json's request, in words."""
    request = held.get("request") if isinstance(held, dict) else None
    if isinstance(request, dict) and "fingerprint" in request:
        return f"a tokenizer given, fingerprint {str(request['fingerprint'])[:12]}"
    if isinstance(request, dict):
        return ", ".join(f"{key} {value}" for key, value in request.items() if value is not None)
    return "unreadable"


def train_tokenizer(args, records):
    """A byte-level BPE of --vocab-size: words counted by the workers, chunk by chunk (on an even
    sample of chunks with --tokenizer-sample), then summed and merged by learn_bpe."""
    chunks = [(path, start, end) for path, record in records.items() for start, end, _ in record["chunks"]]
    total = sum(end - start for _, start, end in chunks)
    if args.tokenizer_sample and args.tokenizer_sample < total:
        chunks = even_sample(chunks, args.tokenizer_sample / total)
        print(f"training the BPE on a sample: {sum(e - s for _, s, e in chunks):,} of {total:,} bytes")
    normalized = f", text normalized as GPT-1's ({args.normalize})" if args.normalize else ""
    print(f"training a byte-level BPE tokenizer of {args.vocab_size} tokens on the corpus{normalized} ...")
    counts_dir = os.path.join(args.out, "counts")
    shutil.rmtree(counts_dir, ignore_errors=True)  # what a stopped run left
    os.makedirs(counts_dir)
    settings = (args.encoding, args.errors, args.normalize)
    tasks = [(chunk, settings, os.path.join(counts_dir, f"{i}.json")) for i, chunk in enumerate(chunks)]
    progress = Progress("counting words", sum(end - start for _, start, end in chunks), "B")
    workers.run_tasks(shards.count_chunk_words, tasks, args.workers, progress.update, progress.total)
    progress.close()
    counts = [task[2] for task in tasks]  # the files learn_bpe sums
    merges = args.vocab_size - cli.SMALLEST_VOCAB  # all but the bytes and the special tokens
    task = (counts, args.vocab_size, merges, args.normalize, os.path.join(counts_dir, "tokenizer"))
    workers.run_tasks(shards.learn_bpe, [task], args.workers, lambda _: None, progress.total, one_apart=True)
    tokenizer = load_tokenizer(task[-1])
    shutil.rmtree(counts_dir)
    args.vocab_size = data.vocabulary_built(args.vocab_size, tokenizer)
    return tokenizer


def even_sample(chunks, fraction):
    """The chunks (path, start, end) that take about `fraction` of the bytes, spread evenly: each is
    taken where the bytes taken so far fall short of `fraction` of those passed, its own included."""
    taken, passed, sample = 0, 0, []
    for chunk in chunks:
        passed += chunk[2] - chunk[1]
        if taken < fraction * passed:
            sample.append(chunk)
            taken += chunk[2] - chunk[1]
    return sample


def encode(args, records, tokenizer):
    """Encode every chunk whose shard is not there whole; returns ({path: its shards' keys}, dtype)."""
    folder = os.path.join(args.out, "shards")
    os.makedirs(folder, exist_ok=True)
    dtype = np.dtype("uint16" if tokenizer.vocab_size <= 2**16 else "uint32")
    how = (args.encoding, args.errors, args.documents == "paragraphs", dtype.name)
    settings = [data.tokenizer_fingerprint(tokenizer), *how]
    keys, tasks = {}, []
    for path, record in records.items():
        keys[path] = [shards.chunk_key(settings, record["sha256"], chunk) for chunk in record["chunks"]]
        for chunk, key in zip(record["chunks"], keys[path]):
            problem = shards.shard_problem(folder, key, dtype.itemsize, full=True)
            if problem not in (None, "missing"):
                print(f"{os.path.join(folder, key)}.bin: damaged ({problem}); writing it again")
            if problem:
                tasks.append(((path, *chunk), (*how, os.path.join(args.out, "tokenizer")), folder, key))
    progress = Progress("encoding", sum(task[0][2] - task[0][1] for task in tasks), "B")
    workers.run_tasks(shards.encode_chunk, tasks, args.workers, progress.update, progress.total)
    progress.close()
    return keys, dtype


def documents_of(record, keys, shard_records, args):
    """The documents of one file, from the parts its shards hold: their hash (the file's, or with
    --documents paragraphs the text's), split and ranges."""
    documents = []
    for key in keys:
        for start, end, digest, begins in shard_records[key]["parts"]:
            if begins or not documents:
                documents.append({"ranges": []})
            documents[-1]["sha256"] = digest if args.documents == "paragraphs" else record["sha256"]
            ranges = documents[-1]["ranges"]
            if ranges and ranges[-1][0] == key and ranges[-1][2] == start:
                ranges[-1][2] = end
            else:
                ranges.append([key, start, end])
    for document in documents:
        document["split"] = dataset.split_of(document["sha256"], args.val_fraction)
    return documents


def write_manifest(args, records, keys, tokenizer, dtype):
    """Write manifest.json (whole, or not at all), then remove the shards it does not name."""
    folder = os.path.join(args.out, "shards")
    shard_records = {key: read_json(f"{folder}/{key}.json") for path in keys for key in keys[path]}
    manifest = {
        "format": dataset.FORMAT,
        "tokenizer": data.tokenizer_fingerprint(tokenizer),
        "dtype": dtype.name,
        **{name: getattr(args, name) for name in ("documents", "val_fraction", "encoding", "errors")},
        "shards": {key: {k: shard[k] for k in ("tokens", "sha256")} for key, shard in shard_records.items()},
        "sources": [
            {**record, "documents": documents_of(record, keys[path], shard_records, args)}
            for path, record in records.items()
        ],
    }
    write_whole(os.path.join(args.out, dataset.MANIFEST), json.dumps(manifest).encode())
    for name in os.listdir(folder):
        if name.split(".")[0] not in shard_records:
            os.remove(os.path.join(folder, name))
    shutil.rmtree(os.path.join(args.out, "counts"), ignore_errors=True)
    return manifest


def check_unchanged(records):
    """A ValueError naming a file that changed or vanished while it was read."""
    for path, record in records.items():
        stat = os.stat(path) if os.path.exists(path) else None
        if stat is None or (stat.st_size, stat.st_mtime_ns) != (record["size"], record["mtime_ns"]):
            how = "vanished" if stat is None else "changed"
            raise ValueError(f"{path}: {how} while it was prepared; run the same command again")


@contextlib.contextmanager
def holding(folder, wait=False):
    """Hold folder/.lock (an flock that dies with this process) within: one prepare per dataset
    folder. With `wait`, wait for another process that holds it (a rank preparing the same text)."""
    with open(os.path.join(folder, ".lock"), "a") as lock:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            if not wait:
                raise OutTaken(f"{folder}: another prepare is writing this dataset") from None
            print(f"waiting for another process that prepares {folder} ...", flush=True)
            fcntl.flock(lock, fcntl.LOCK_EX)
        yield


class OutTaken(Exception):
    """--out cannot take this dataset: another prepare holds it, or it holds another tokenizer's."""


def make_dataset(args, wait=False, given=None):
    """Prepare the files of args.data into the dataset folder args.out, with prepare's settings
    (args: its flags) and the tokenizer `given` if one is; returns the manifest. `wait`: for another
    process preparing the same folder."""
    files, skipped = corpus.find_sources(args.data, tuple(args.extensions))
    for path, why in skipped[:20]:
        print(f"not read: {path} ({why})")
    if len(skipped) > 20:
        print(f"not read: {len(skipped) - 20:,} more files")
    if not files:
        named = " ".join(map(str, args.data))
        raise ValueError(f"the corpus in {named} is empty" if skipped else f"no text files found in {named}")
    os.makedirs(args.out, exist_ok=True)
    if args.workers > 1:
        workers.start_server()  # it imports while this process reads the files
    with holding(args.out, wait):
        if args.overwrite:
            for name in (dataset.MANIFEST, "tokenizer.json", "tokenizer", "shards"):
                path = os.path.join(args.out, name)
                shutil.rmtree(path) if os.path.isdir(path) else os.path.exists(path) and os.remove(path)
        records = plan(args, files, dataset.read_manifest(args.out))
        tokenizer = build_tokenizer(args, records, given)
        keys, dtype = encode(args, records, tokenizer)
        check_unchanged(records)
        return write_manifest(args, records, keys, tokenizer, dtype)


def summary(manifest, seconds):
    """The closing lines: documents and tokens in each split, the shards, the time."""
    counts = {"train": [0, 0], "val": [0, 0]}
    for source in manifest["sources"]:
        for document in source["documents"]:
            counts[document["split"]][0] += 1
            counts[document["split"]][1] += sum(end - start for _, start, end in document["ranges"])
    for split, (documents, tokens) in counts.items():
        print(f"{split}: {documents:,} documents, {tokens:,} tokens")
    if not counts["val"][0]:
        print("no document is held out: pretrain will hold out the end of the training tokens (for a split")
        print("by content, --documents paragraphs, more files or a larger --val-fraction)")
    shards_written = f"{len(manifest['shards']):,} shard{'s' * (len(manifest['shards']) != 1)}"
    print(f"{shards_written} of {manifest['dtype']} ids, in {seconds:.1f} s")


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
    try:
        os.makedirs(settings.out, exist_ok=True)
        open(os.path.join(settings.out, ".lock"), "a").close()
    except OSError as error:
        reason = f"cannot prepare the text there ({error.strerror}); using a temporary folder"
        warnings.warn(f"{settings.out}: {reason}", stacklevel=2)
        settings.out = tempfile.mkdtemp(prefix="tinygpt-data-")
        cli.on_return(shutil.rmtree, settings.out, True)
    stop = signal.signal(signal.SIGTERM, signal.default_int_handler)  # as prepare's: the workers stopped
    try:
        make_dataset(settings, wait=True, given=given)
    except OutTaken:  # a cache folder changed by hand: it is only a cache
        settings.overwrite = True
        make_dataset(settings, wait=True, given=given)
    finally:
        signal.signal(signal.SIGTERM, stop)
    return settings.out


@cli.command(parse_args)
def main(parser, args):
    began = time.monotonic()
    signal.signal(signal.SIGTERM, signal.default_int_handler)  # a kill stops the workers as Ctrl-C does
    flag = "--tokenizer" if args.tokenizer else "--gpt1-tokenizer"
    with cli.reading(parser, flag):  # before any reading of the corpus
        given = (args.tokenizer or args.gpt1_tokenizer) and given_tokenizer(args)
    try:
        with cli.reading(parser, "--data"):
            manifest = make_dataset(args, given=given)
    except OutTaken as error:
        parser.error(f"--out: {error}")
    summary(manifest, time.monotonic() - began)
    print(f"dataset: {args.out} (train on it: python -m train.pretrain --data {args.out})")


if __name__ == "__main__":
    main()
