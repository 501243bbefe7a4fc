"""A prepared dataset folder, as a run reads it: the tokenizer, the manifest, the packs of ids.

    DATASET/tokenizer/         the tokenizer, as a run folder holds it
    DATASET/shards/<key>.bin   a pack: the ids of many documents (uint16 where they fit, else
                               uint32), memory-mapped
    DATASET/shards/<key>.idx   each document part's end, whether it begins its document, and its
                               digest (train/packs.py)
    DATASET/manifest.json      the packs in order (tokens, documents, the SHA-256 of both files),
                               the tokenizer's fingerprint, the settings: small at any size
    DATASET/sources.jsonl      what prepare read, a line a file (train/prepare.py)

A run reads the manifest and the packs' indexes at its start (17 bytes a document: a million
documents in a few hundredths of a second) and maps the ids. A document goes to the validation
split when its digest, read as a fraction of 2**64, is below the manifest's val_fraction: adding or
editing a file moves no other document between the splits. A run holds a shared lock on the
folder's .lock while it reads, which prepare respects.
"""

import collections
import hashlib
import json
import os
import re

import numpy as np

from autograd.serialization import load_file

from .dataset_folder import KEY, hold_shared

MANIFEST = "manifest.json"
FORMAT = "tinygpt-dataset-2"
MARKERS = (MANIFEST, "tokenizer.json", "sources.jsonl")  # what a folder prepare began to write holds


def is_dataset(path):
    """Whether `path` is a folder train.prepare wrote, whole or not yet."""
    return any(os.path.isfile(os.path.join(path, name)) for name in MARKERS)


def read_manifest(folder):
    """The manifest of a dataset folder, or None where there is none (or none whole, or an older format)."""
    try:
        with open(os.path.join(folder, MANIFEST), encoding="utf-8") as file:
            manifest = json.load(file)
    except (OSError, ValueError):
        return None
    return manifest if isinstance(manifest, dict) and manifest.get("format") == FORMAT else None


def check_manifest(manifest):
    """An error (KeyError, TypeError, ValueError) where a manifest is not of prepare's shape."""
    if manifest.get("format") != FORMAT or manifest["dtype"] not in ("uint16", "uint32"):
        raise ValueError(f"format {manifest.get('format')!r}, dtype {manifest.get('dtype')!r}")
    if not 0 < manifest["val_fraction"] < 1:
        raise ValueError(f"val_fraction {manifest['val_fraction']!r}")
    for pack in manifest["packs"]:
        numbers = [pack["tokens"], pack["documents"]]
        if not re.fullmatch(KEY, pack["key"]) or any(type(n) is not int or n < 0 for n in numbers):
            raise ValueError(f"pack {pack!r}")
        str.encode(pack["sha256"] + pack["index_sha256"])
    str.encode(manifest["tokenizer"])


def manifest_digest(manifest):
    """A hash of what a run trains on: the packs' contents and the split (not where the files are)."""
    packs = [[pack["sha256"], pack["index_sha256"]] for pack in manifest["packs"]]
    return hashlib.sha256(json.dumps([packs, manifest["val_fraction"]]).encode()).hexdigest()


class Dataset:
    """A prepared folder's manifest, and its splits as Tokens. Opening checks each pack cheaply (its
    size, its index's SHA-256); a pack's ids are hashed whole the first time a run reads them."""

    def __init__(self, folder):
        self.folder = folder
        path = os.path.join(folder, MANIFEST)
        if not os.path.isfile(path) and is_dataset(folder):
            raise ValueError(f"{folder}: train.prepare did not finish this dataset; run it again to go on")
        lock = hold_shared(folder)
        with open(path, encoding="utf-8") as file:
            try:
                self.manifest = json.load(file)
            except ValueError as error:
                raise ValueError(f"{path}: not a readable manifest ({error})") from None
        try:
            check_manifest(self.manifest)
        except (KeyError, TypeError, ValueError, AttributeError) as error:
            raise ValueError(
                f"{path}: not a manifest train.prepare wrote ({error!r}); prepare again"
            ) from None
        self.dtype = np.dtype(self.manifest["dtype"])
        self.keys = [pack["key"] for pack in self.manifest["packs"]]
        threshold = np.uint64(min(int(self.manifest["val_fraction"] * 2**64), 2**64 - 1))
        ranges = {"train": [], "val": []}
        for number, pack in enumerate(self.manifest["packs"]):
            ends, held_out = self._check_pack(pack)
            for split, mask in (("train", ~(held_out < threshold)), ("val", held_out < threshold)):
                ranges[split].append(runs(number, ends, mask))
        self.digest = manifest_digest(self.manifest)
        self.fingerprint = self.manifest["tokenizer"]
        self.packs = Packs(folder, self.manifest["packs"], self.dtype, lock)
        self.train, self.val = (Tokens(self.packs, *joined(ranges[split])) for split in ("train", "val"))

    def _check_pack(self, pack):
        """(its parts' ends, their digests) of a pack whose .bin has the size the manifest records
        and whose .idx its SHA-256; else a ValueError naming the file and what to run."""
        stem = os.path.join(self.folder, "shards", pack["key"])
        again = "run python -m train.prepare again (the command that wrote the dataset) to write it again"
        size = os.path.getsize(stem + ".bin") if os.path.exists(stem + ".bin") else None
        expected = pack["tokens"] * self.dtype.itemsize
        if size != expected or not os.path.exists(stem + ".idx"):
            how = (
                "missing"
                if size is None or not os.path.exists(stem + ".idx")
                else f"{size:,} bytes, not {expected:,}"
            )
            raise ValueError(f"{stem}.{'bin' if size != expected else 'idx'}: {how}; {again}")
        if file_digest(stem + ".idx") != pack["index_sha256"]:
            raise ValueError(f"{stem}.idx: damaged (not the SHA-256 the manifest records); {again}")
        ends, _, digests = read_index(stem + ".idx")
        if len(ends) and (ends[-1] != pack["tokens"] or np.any(np.diff(ends) < 0)):
            raise ValueError(f"{stem}.idx: its parts do not cover the pack's {pack['tokens']:,} ids; {again}")
        return ends, digests

    def close(self):
        """Let go of the dataset's lock: the packs read so far stay mapped."""
        if self.packs.lock:
            self.packs.lock.close()


class Packs:
    """The ids of a dataset's packs, each memory-mapped when first read (the last 256 kept open),
    and the shared lock on the dataset that they hold while any of them can be read."""

    def __init__(self, folder, packs, dtype, lock):
        self.folder, self.packs, self.dtype, self.lock = folder, packs, dtype, lock
        self.maps, self.checked = collections.OrderedDict(), set()

    def ids(self, number):
        """The ids of pack `number`, once their SHA-256 is checked against the manifest's."""
        if number in self.maps:
            self.maps.move_to_end(number)
            return self.maps[number]
        pack = self.packs[number]
        path = os.path.join(self.folder, "shards", f"{pack['key']}.bin")
        if number not in self.checked:
            if file_digest(path) != pack["sha256"]:  # an OSError: one line
                raise OSError(
                    f"{path}: damaged (its ids do not match the manifest's SHA-256); "
                    "run python -m train.prepare again to rewrite it"
                )
            self.checked.add(number)
        self.maps[number] = (
            np.memmap(path, dtype=self.dtype, mode="r") if pack["tokens"] else np.zeros(0, self.dtype)
        )
        if len(self.maps) > 256:
            self.maps.popitem(last=False)
        return self.maps[number]


def read_index(path):
    """The arrays of a pack's .idx: ends (int64), begins (bool), digests (uint64)."""
    index = load_file(path)
    if set(index) != {"ends", "begins", "digests"} or len({len(a) for a in index.values()}) != 1:
        raise ValueError(f"{path}: not a pack's index")
    return index["ends"].astype(np.int64), index["begins"].astype(bool), index["digests"].astype(np.uint64)


def file_digest(path):
    with open(path, "rb") as file:
        return hashlib.file_digest(file, "sha256").hexdigest()


def runs(number, ends, mask):
    """(pack numbers, starts, ends) of the runs of consecutive parts of pack `number` where `mask`."""
    starts = np.concatenate([[0], ends[:-1]])
    edges = np.flatnonzero(np.diff(np.concatenate([[False], mask, [False]]).astype(np.int8)))
    first, last = edges[0::2], edges[1::2] - 1
    return np.full(len(first), number, np.int64), starts[first], ends[last]


def joined(ranges):
    """The three arrays of every pack's runs, one after the other."""
    return [np.concatenate([r[i] for r in ranges]) if ranges else np.zeros(0, np.int64) for i in range(3)]


class Tokens:
    """The ids of ranges (pack, start, end) of Packs, read as one 1-D array: len(), a slice (another
    Tokens, nothing read yet), np.asarray() (the ids read), blocks() (range by range)."""

    def __init__(self, source, packs, starts, ends):
        keep = ends > starts
        self.source, self.packs, self.starts, self.stops = source, packs[keep], starts[keep], ends[keep]
        self.ends = np.cumsum(self.stops - self.starts, dtype=np.int64)

    def __len__(self):
        return int(self.ends[-1]) if len(self.ends) else 0

    def __getitem__(self, index):
        start, stop, step = index.indices(len(self))
        if step != 1:
            raise ValueError("Tokens: a slice with a step")
        first = int(np.searchsorted(self.ends, start, side="right"))
        last = int(np.searchsorted(self.ends, stop, side="left")) + 1
        begins_at = self.ends[first:last] - (self.stops[first:last] - self.starts[first:last])
        starts = self.starts[first:last] + np.maximum(start - begins_at, 0)
        stops = self.starts[first:last] + np.minimum(
            stop - begins_at, self.stops[first:last] - self.starts[first:last]
        )
        return Tokens(self.source, self.packs[first:last], starts, np.maximum(stops, starts))

    def __array__(self, dtype=None, copy=None):
        ids = np.concatenate(list(self.blocks())) if len(self.packs) else np.zeros(0, self.source.dtype)
        return ids if dtype is None else ids.astype(dtype)

    def blocks(self):
        """The ids range by range."""
        for number, begin, end in zip(self.packs.tolist(), self.starts.tolist(), self.stops.tolist()):
            yield self.source.ids(number)[begin:end]
