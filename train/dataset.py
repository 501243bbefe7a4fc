"""A prepared dataset folder, as a run reads it: the tokenizer, the manifest, the shards of ids.

    DATASET/tokenizer/       the tokenizer, as a run folder holds it
    DATASET/shards/<key>.bin token ids (uint16 where they fit, else uint32), memory-mapped
    DATASET/manifest.json    every source file (size, time, SHA-256) with its documents (SHA-256,
                             split, token ranges in shards), the tokenizer's fingerprint, each
                             shard's token count and SHA-256

A document goes to the validation split when its hash, read as a fraction of 2**256, is below
the validation fraction: adding or editing a file moves no other document between the splits.
"""

import functools
import hashlib
import json
import os
import re

import numpy as np

from .shards import file_digest

MANIFEST = "manifest.json"
FORMAT = "tinygpt-dataset-1"


def is_dataset(path):
    return os.path.isfile(os.path.join(path, MANIFEST))


def read_manifest(folder):
    """The manifest of a dataset folder, or None where there is none (or none whole)."""
    try:
        with open(os.path.join(folder, MANIFEST), encoding="utf-8") as file:
            manifest = json.load(file)
    except (OSError, ValueError):
        return None
    return manifest if isinstance(manifest, dict) and manifest.get("format") == FORMAT else None


def split_of(document_digest, val_fraction):
    """The split of a document, "val" or "train": a function of its content hash alone."""
    return "val" if int(document_digest, 16) < val_fraction * 16 ** len(document_digest) else "train"


def manifest_digest(manifest):
    """A hash of what a run trains on: the shards' digests and the documents' ranges and splits (not
    where the files are or when they were written)."""
    documents = [source["documents"] for source in manifest["sources"]]
    return hashlib.sha256(json.dumps([manifest["shards"], documents]).encode()).hexdigest()


def check_manifest(manifest):
    """{"train": ranges, "val": ranges} of a manifest, each range [shard, start, end] inside its
    shard; an error (KeyError, TypeError, ValueError) where the manifest is not of that shape."""
    if manifest.get("format") != FORMAT or manifest["dtype"] not in ("uint16", "uint32"):
        raise ValueError(f"format {manifest.get('format')!r}, dtype {manifest.get('dtype')!r}")
    for key, record in manifest["shards"].items():
        if not re.fullmatch("[0-9a-f]{32}", key) or type(record["tokens"]) is not int or record["tokens"] < 0:
            raise ValueError(f"shard {key!r}: {record!r}")
        str.encode(record["sha256"])
    ranges = {"train": [], "val": []}
    for document in (document for source in manifest["sources"] for document in source["documents"]):
        for key, start, end in document["ranges"]:
            if not (
                type(start) is type(end) is int and 0 <= start <= end <= manifest["shards"][key]["tokens"]
            ):
                raise ValueError(f"range {[key, start, end]!r}")
        ranges[document["split"]] += document["ranges"]
    str.encode(manifest["tokenizer"])
    return ranges


class Dataset:
    """A prepared folder's manifest, and its splits as Tokens. Opening checks each shard cheaply (it
    is there, its size); a shard is hashed whole the first time a run reads from it."""

    def __init__(self, folder):
        self.folder = folder
        path = os.path.join(folder, MANIFEST)
        with open(path, encoding="utf-8") as file:
            try:
                self.manifest = json.load(file)
            except ValueError as error:
                raise ValueError(f"{path}: not a readable manifest ({error})") from None
        try:
            ranges = check_manifest(self.manifest)
        except (KeyError, TypeError, ValueError, AttributeError) as error:
            raise ValueError(
                f"{path}: not a manifest train.prepare wrote ({error!r}); prepare again"
            ) from None
        self.dtype = np.dtype(self.manifest["dtype"])
        for key, record in self.manifest["shards"].items():
            bin_path = os.path.join(folder, "shards", f"{key}.bin")
            size = os.path.getsize(bin_path) if os.path.exists(bin_path) else None
            expected = record["tokens"] * self.dtype.itemsize
            if size != expected:
                raise ValueError(
                    f"{bin_path}: missing or cut short ({size} bytes where {expected} are recorded); "
                    "run python -m train.prepare again to rewrite it"
                )
        self.shard = functools.lru_cache(maxsize=256)(self._open_shard)  # memory maps kept open
        self._checked = set()
        self.digest = manifest_digest(self.manifest)
        self.fingerprint = self.manifest["tokenizer"]
        self.train = Tokens(self, ranges["train"])
        self.val = Tokens(self, ranges["val"])

    def _open_shard(self, key):
        """The ids of shard `key`, memory-mapped, once its SHA-256 is checked against the manifest."""
        path = os.path.join(self.folder, "shards", f"{key}.bin")
        if key not in self._checked:
            if file_digest(path) != self.manifest["shards"][key]["sha256"]:  # an OSError: one line
                raise OSError(
                    f"{path}: damaged (its ids do not match the manifest's SHA-256); "
                    "run python -m train.prepare again to rewrite it"
                )
            self._checked.add(key)
        return np.memmap(path, dtype=self.dtype, mode="r")


class Tokens:
    """The ids of [shard, start, end] ranges, read as one 1-D array: len(), a slice (another
    Tokens, nothing read yet), np.asarray() (the ids read), blocks() (range by range)."""

    def __init__(self, dataset, ranges):
        self.dataset, self.ranges = dataset, ranges
        self.ends = np.cumsum([end - start for _, start, end in ranges], dtype=np.int64)

    def __len__(self):
        return int(self.ends[-1]) if len(self.ends) else 0

    def __getitem__(self, index):
        start, stop, step = index.indices(len(self))
        if step != 1:
            raise ValueError("Tokens: a slice with a step")
        ranges, first = [], int(np.searchsorted(self.ends, start, side="right"))
        for (key, begin, end), ends_at in zip(self.ranges[first:], self.ends[first:]):
            begins_at = int(ends_at) - (end - begin)  # where this range starts in the whole
            if begins_at >= stop:
                break
            ranges.append(
                [key, begin + max(start - begins_at, 0), begin + min(stop - begins_at, end - begin)]
            )
        return Tokens(self.dataset, ranges)

    def __array__(self, dtype=None, copy=None):
        ids = np.concatenate(list(self.blocks())) if self.ranges else np.zeros(0, self.dataset.dtype)
        return ids if dtype is None else ids.astype(dtype)

    def blocks(self):
        """The ids range by range."""
        for key, begin, end in self.ranges:
            yield self.dataset.shard(key)[begin:end]
