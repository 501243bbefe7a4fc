"""The tokenizer of a dataset that prepare writes: the one given (--tokenizer, --gpt1-tokenizer), the
one --out holds already for the same request (where it is the one prepare saved there, by its
fingerprint), or a byte-level BPE trained on the corpus by the workers. It is saved in
--out/tokenizer before any encoding, and what it was made for, and its fingerprint, in tokenizer.json.
"""

import json
import os
import shutil

from tinygpt.files import read_json, write_whole
from tinygpt.tokenizer import load_tokenizer

from . import cli, data, packs, shards, workers
from .dataset_folder import OutTaken
from .progress import Progress

DEFAULT_VOCAB = 2048


def request_of(args, given):
    """What decides the dataset's tokenizer: the fingerprint of one given, else what to train."""
    if given:
        return {"fingerprint": data.tokenizer_fingerprint(given)}
    return {
        "vocab_size": args.vocab_size or DEFAULT_VOCAB,
        "normalizer": args.normalize,
        "sample": args.tokenizer_sample,
    }


def kept(args, request):
    """The tokenizer --out holds for `request`, where it is the one prepare saved there (the
    fingerprint tokenizer.json records); None where there is none to reuse. An OutTaken where
    --out holds the dataset of another tokenizer."""
    folder, path = os.path.join(args.out, "tokenizer"), os.path.join(args.out, "tokenizer.json")
    if not os.path.isfile(path):
        return None
    held = read_json(path)
    if not isinstance(held, dict) or held.get("request") != request:
        raise OutTaken(
            f"{args.out} holds the dataset of another tokenizer ({describe(held)}); "
            "pass --overwrite to start it afresh, or another --out"
        )
    try:
        tokenizer = load_tokenizer(folder)
    except (OSError, ValueError):
        tokenizer = None
    if tokenizer is None or data.tokenizer_fingerprint(tokenizer) != held.get("fingerprint"):
        print(f"{folder}: missing, or not the tokenizer prepare saved there; making it again")
        return None
    return tokenizer


def describe(held):
    """tokenizer.json's request, in words."""
    request = held.get("request") if isinstance(held, dict) else None
    if isinstance(request, dict) and "fingerprint" in request:
        return f"a tokenizer given, fingerprint {str(request['fingerprint'])[:12]}"
    if isinstance(request, dict):
        return ", ".join(f"{key} {value}" for key, value in request.items() if value is not None)
    return "unreadable"


def save(args, tokenizer, request):
    """Save the dataset's tokenizer in --out/tokenizer, and what it was made for in tokenizer.json."""
    folder = os.path.join(args.out, "tokenizer")
    shutil.rmtree(folder + ".partial", ignore_errors=True)
    tokenizer.save(folder + ".partial")
    shutil.rmtree(folder, ignore_errors=True)
    os.replace(folder + ".partial", folder)
    record = {"request": request, "fingerprint": data.tokenizer_fingerprint(tokenizer)}
    write_whole(os.path.join(args.out, "tokenizer.json"), json.dumps(record).encode())


def trained(args, units, loader, reading):
    """A byte-level BPE of --vocab-size: words counted by the workers, task by task (on an even
    sample of the chunks with --tokenizer-sample), then summed and merged by learn_bpe."""
    vocab_size = args.vocab_size or DEFAULT_VOCAB
    total = sum(unit.size for unit in units)
    if args.tokenizer_sample and args.tokenizer_sample < total:
        units = even_sample(units, args.tokenizer_sample / total)
        print(f"training the BPE on a sample: {sum(unit.size for unit in units):,} of {total:,} bytes")
    normalized = f", text normalized as GPT-1's ({args.normalize})" if args.normalize else ""
    print(f"training a byte-level BPE tokenizer of {vocab_size} tokens on the corpus{normalized} ...")
    counts_dir = os.path.join(args.out, "work", "counts")
    shutil.rmtree(counts_dir, ignore_errors=True)  # what a stopped run left
    os.makedirs(counts_dir)
    tasks = [task for pack in packs.plan_packs(units, None) for task in pack.tasks]
    out = [os.path.join(counts_dir, f"{number}.json") for number in range(len(tasks))]
    progress = Progress("counting words", sum(task.size for task in tasks), "B")
    job = lambda number: (loader.items(tasks[number]), reading, args.normalize, out[number])  # noqa: E731
    workers.run_tasks(
        shards.count_task, range(len(tasks)), args.workers, progress.update, progress.total, load=job
    )
    progress.close()
    merges = vocab_size - cli.SMALLEST_VOCAB  # all but the bytes and the special tokens
    task = (out, vocab_size, merges, args.normalize, os.path.join(args.out, "work", "bpe"))
    workers.run_tasks(shards.learn_bpe, [task], args.workers, lambda _: None, progress.total, one_apart=True)
    tokenizer = load_tokenizer(task[-1])
    data.vocabulary_built(vocab_size, tokenizer)
    return tokenizer


def even_sample(units, fraction):
    """The units that take about `fraction` of the bytes, spread evenly: each is taken where the
    bytes taken so far fall short of `fraction` of those passed, its own included."""
    taken, passed, sample = 0, 0, []
    for unit in units:
        passed += unit.size
        if taken < fraction * passed:
            sample.append(unit)
            taken += unit.size
    return sample
