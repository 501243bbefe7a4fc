"""`python -m train.prepare` on corpora of the shapes real ones ship in, beside Hugging Face `tokenizers`.

    PYTHONPATH=. python bench/prepare_shapes.py [--mb 100] [--files 50000] [--documents 1000000]
        [--workers 2] [--out bench/results/cpu-prepare-shapes.json]

The same text (paragraphs of ../shared/data/pretrain, drawn with a seeded RNG) as --files files, as
one .jsonl.gz of as many records, and as one file; and --documents short documents (a sentence or
two, ~100 bytes) as one .jsonl. Each is prepared with one BPE of 8,192 tokens (trained here once,
on 10 MB of the text) by --workers workers, and encoded by `tokenizers`' encode_batch with as many
threads (RAYON_NUM_THREADS) from the same files, read as a user of `tokenizers` reads them (a text
file, a record: one document; the one file a line at a time). For each: seconds, MB/s, peak memory
of the whole process tree, then for tinygpt the count of shard files, the size of what a run reads
at its start (manifest and indexes) and `train.pretrain`'s seconds to its first step. Goals: small
files and JSON lines within 1.25x of the one file's time; peak memory under 1 GB; at least
`tokenizers`' MB/s; the first step within 10 s at a million documents.
"""

import argparse
import gzip
import json
import os
import random
import re
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from prepare_speed import hf_tokenizer, measure, paragraphs, table  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]


def make_shapes(folder, mb, files, documents, seed):
    """{shape: the paths prepare is given} of the corpora (kept where already there)."""
    shapes = {
        "files": [folder / "files"],
        "one .jsonl.gz": [folder / "docs.jsonl.gz"],
        "one file": [folder / "one.txt"],
        "short documents, one .jsonl": [folder / "short.jsonl"],
    }
    if (folder / "done").exists():
        return shapes
    rng, base = random.Random(seed), paragraphs()
    size, texts = mb * 10**6 // files, []
    while len(texts) < files:
        text = ""
        while len(text) < size:
            text += rng.choice(base) + "\n\n"
        texts.append(text[: size + size // 4].strip())
    for number, text in enumerate(texts):
        (folder / "files" / f"{number // 1000:03}").mkdir(parents=True, exist_ok=True)
        (folder / "files" / f"{number // 1000:03}" / f"{number:06}.txt").write_text(text, encoding="utf-8")
    (folder / "one.txt").write_text("\n\n".join(texts), encoding="utf-8")
    with gzip.open(folder / "docs.jsonl.gz", "wt", encoding="utf-8") as out:
        out.writelines(json.dumps({"text": text}) + "\n" for text in texts)
    sentences = [s for p in base for s in re.split(r"(?<=[.!?])\s+", p) if 40 < len(s) < 160]
    with open(folder / "short.jsonl", "w", encoding="utf-8") as out:
        for _ in range(documents):
            text = rng.choice(sentences)
            while len(text) < 80:
                text += " " + rng.choice(sentences)
            out.write(json.dumps({"text": text[:120]}) + "\n")
    (folder / "done").write_text("")
    return shapes


def documents_of(path):
    """The documents `tokenizers` is given of a path: a text file's whole text, each record's text
    (a folder: each of its files), the one file's lines (as `datasets`' text loader cuts it)."""
    if path.is_dir():
        for below in sorted(path.rglob("*.txt")):
            yield below.read_text(encoding="utf-8")
    elif path.suffix in (".gz", ".jsonl"):
        with (gzip.open if path.suffix == ".gz" else open)(path, "rt", encoding="utf-8") as lines:
            for line in lines:
                yield json.loads(line)["text"]
    else:
        with open(path, encoding="utf-8") as lines:
            yield from lines


def child(spec):
    """Encode the documents of spec's paths with `tokenizers`, 1,000 at a time; print its seconds."""
    import numpy as np

    began, tokenizer, batch = time.monotonic(), hf_tokenizer(spec["tokenizer"], False), []
    with open(spec["ids"], "wb") as out:

        def encode():
            encodings = tokenizer.encode_batch(batch, add_special_tokens=False)
            np.fromiter((i for e in encodings for i in e.ids), dtype=np.uint16).tofile(out)
            batch.clear()

        for path in spec["paths"]:
            for document in documents_of(Path(path)):
                batch.append(document)
                if len(batch) == 1000:
                    encode()
        encode()
        tokens = out.tell() // 2
    print(json.dumps({"seconds": round(time.monotonic() - began, 2), "tokens": tokens}))


def dataset_sizes(folder):
    """(shard files, bytes a run reads at its start: the manifest and the packs' indexes)."""
    shards = os.listdir(folder / "shards")
    start = (folder / "manifest.json").stat().st_size
    start += sum((folder / "shards" / name).stat().st_size for name in shards if name.endswith(".idx"))
    return len(shards), start


def first_step(dataset, out):
    """train.pretrain on a dataset: seconds to its first line that says 'step'."""
    cmd = [sys.executable, "-m", "train.pretrain", "--data", dataset, "--steps", 1, "--device", "cpu"]
    record, lines = measure([*cmd, "--eval-windows", 1, "--sample-tokens", 0, "--out", out, "--overwrite"])
    return next((t for t, line in lines if "step" in line.lower()), None), record["wall_s"]


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mb", type=int, default=100, help="of the text of the first three shapes")
    parser.add_argument("--files", type=int, default=50_000, help="files and records of that text")
    parser.add_argument("--documents", type=int, default=1_000_000, help="short documents of the last shape")
    parser.add_argument("--workers", type=int, default=2, help="prepare's workers, tokenizers' threads")
    parser.add_argument("--workdir", type=Path, default=Path("/tmp/prepare_shapes"))
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, help="write the results as JSON here")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    parser.add_argument("--make", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        return child(json.loads(args.child))
    import tokenizers

    from tinygpt.tokenizer import BPETokenizer

    args.workdir.mkdir(parents=True, exist_ok=True)
    bpe = args.workdir / "bpe-8192"
    if (
        args.make
    ):  # in a process of its own: a process forked from a large one starts with its size (ru_maxrss)
        make_shapes(args.workdir, args.mb, args.files, args.documents, args.seed)
        if not bpe.is_dir():
            text = (args.workdir / "one.txt").read_text(encoding="utf-8")[: 10**7]
            BPETokenizer.train([text], 8192).save(bpe)
        return None
    subprocess.run([sys.executable, __file__, *sys.argv[1:], "--make"], check=True)
    shapes = make_shapes(args.workdir, args.mb, args.files, args.documents, args.seed)
    results = {"machine": {"cpus": os.cpu_count(), "tokenizers": tokenizers.__version__}, "shapes": {}}
    rows = []
    for shape, paths in shapes.items():
        out = args.workdir / f"ds-{len(results['shapes'])}"
        cmd = [sys.executable, "-m", "train.prepare", "--data", *paths, "--out", out, "--overwrite"]
        ours = measure([*cmd, "--tokenizer", bpe, "--workers", args.workers])[0]
        spec = {"paths": [str(p) for p in paths], "tokenizer": str(bpe), "ids": str(args.workdir / "hf.bin")}
        child_cmd = [sys.executable, __file__, "--child", json.dumps(spec)]
        record, lines = measure(child_cmd, {"RAYON_NUM_THREADS": str(args.workers)})
        theirs = {**record, **json.loads(lines[-1][1])} if record["rc"] == 0 else record
        mb = sum(
            p.stat().st_size for path in paths for p in (path.rglob("*.txt") if path.is_dir() else [path])
        )
        mb = mb / 1e6 if "gz" not in shape else (args.workdir / "one.txt").stat().st_size / 1e6
        shard_files, start_bytes = dataset_sizes(out)
        step, wall = first_step(out, args.workdir / "run")
        results["shapes"][shape] = {
            "mb": mb,
            "tinygpt": ours,
            "tokenizers": theirs,
            "shard_files": shard_files,
        }
        results["shapes"][shape].update(start_bytes=start_bytes, first_step_s=step, pretrain_wall_s=wall)
        encoding = ours["phases_s"].get("encoding")
        rows.append([shape, mb, ours["wall_s"], encoding, mb / ours["wall_s"], theirs.get("seconds")])
        rows[-1] += [mb / theirs["seconds"] if theirs.get("seconds") else 0.0, ours["peak_tree_pss_mb"]]
        rows[-1] += [theirs["peak_tree_pss_mb"], shard_files, start_bytes / 2**20, step]
        if args.out:
            args.out.parent.mkdir(parents=True, exist_ok=True)
            args.out.write_text(json.dumps(results, indent=1, default=str) + "\n")
    one = results["shapes"]["one file"]["tinygpt"]["wall_s"]
    for row in rows:
        row.insert(3, row[2] / one)
    header = ["shape", "MB", "tinygpt s (whole prepare)", "x one file", "of which encoding s"]
    header += ["tinygpt MB/s", "tokenizers s (encode_batch)", "tokenizers MB/s", "tinygpt peak MB (PSS)"]
    header += ["tokenizers peak MB (PSS)", "shard files", "a run's start reads (MiB)", "first step s"]
    table(
        f"prepare with {args.workers} workers, tokenizers with {args.workers} threads, one BPE of 8,192",
        header,
        rows,
    )


if __name__ == "__main__":
    main()
