"""`python -m train.prepare` against Hugging Face `tokenizers`: BPE training, encoding, memory.

    PYTHONPATH=. python bench/prepare_speed.py [--sizes-mb 50 200 400] [--out results.json]

Builds corpora of 1 MB files from ../shared/data/pretrain (paragraphs shuffled with a seeded RNG,
some lower-cased, upper-cased or rotated by a random Caesar shift, so the vocabulary keeps growing
with the corpus) and one single large file, then measures, each in a process of its own: (1) BPE
training time and peak memory, tinygpt's `prepare` (its 'counting words' + 'merging' phases) beside
the `tokenizers` ByteLevel BpeTrainer; (2) encoding MB/s with 1 and 2 workers (threads for
`tokenizers`, RAYON_NUM_THREADS) with the same BPE and with GPT-1's; (3) peak memory of a whole
`prepare` per corpus size; (4) `train.pretrain`'s time to its first step; (5) an extrapolation to
5 GB. Peak memory: the largest process (its VmHWM, polled, or wait4's ru_maxrss) and the whole
process tree (the sum of its resident sets, polled every 0.1 s; and the sum of its proportional
sets, which count a page that forked processes share once). Text is in MB (10^6 bytes), memory
in MiB (2^20 bytes).
"""

import argparse
import json
import math
import os
import platform
import random
import re
import statistics
import string
import subprocess
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SHARED = ROOT.parent / "shared" / "data"
GPT1 = SHARED / "gpt1-bpe"
PAGE = os.sysconf("SC_PAGE_SIZE")
TICKS = os.sysconf("SC_CLK_TCK")  # of the CPU times in /proc/<pid>/stat
LOW, UP = string.ascii_lowercase, string.ascii_uppercase
ROT = {k: str.maketrans(LOW + UP, LOW[k:] + LOW[:k] + UP[k:] + UP[:k]) for k in range(1, 26)}
PHASE = re.compile(r"^(reading|counting words|merging|encoding): .* in ([\d.]+) s$")


def paragraphs():
    folder = SHARED / "pretrain"
    files = [*sorted(folder.glob("gutenberg/*.txt")), folder / "tinyshakespeare/input.txt"]
    texts = [
        path.read_text(encoding="utf-8", errors="replace")
        for path in files + sorted(folder.glob("wikitext-2/*.txt"))
    ]
    return [p.strip() for text in texts for p in re.split(r"\n\s*\n", text) if p.strip()]


def make_corpus(folder, count, seed):
    """`count` files of about 1 MB each in folder (kept if already there); returns their paths."""
    paths = [folder / f"{i:04d}.txt" for i in range(count)]
    if all(path.exists() for path in paths):
        return paths
    folder.mkdir(parents=True, exist_ok=True)
    rng, base = random.Random(seed), paragraphs()

    def stream():
        while True:
            rng.shuffle(base)
            for p in base:
                r = rng.random()
                yield (
                    p.lower()
                    if r < 0.1
                    else p.upper()
                    if r < 0.2
                    else p.translate(ROT[rng.randint(1, 25)])
                    if r < 0.3
                    else p
                )

    texts = stream()
    for path in paths:
        chunk, size = [], 0
        while size < 10**6:
            chunk.append(next(texts))
            size += len(chunk[-1].encode()) + 2
        path.write_text("\n\n".join(chunk) + "\n", encoding="utf-8")
    return paths


def tree_memory(pid, cpu):
    """(resident, proportional, largest) bytes of pid and all its descendants now: the sum of their
    resident sets; of their proportional sets, where a page that k processes share (a forked worker's
    imports, shared with the process it was forked from) counts 1/k in each; and the largest
    high-water mark of one process's resident set (a forked worker's parent is not this one, so
    wait4's ru_maxrss does not see it). Records in `cpu` the CPU seconds each has used so far."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        rss = int(Path(f"/proc/{pid}/statm").read_text().split()[1]) * PAGE
        rollup = Path(f"/proc/{pid}/smaps_rollup").read_text()
        pss = int(re.search(r"^Pss:\s+(\d+) kB", rollup, re.M)[1]) * 1024
        hwm = int(re.search(r"^VmHWM:\s+(\d+) kB", Path(f"/proc/{pid}/status").read_text(), re.M)[1]) * 1024
        tasks = os.listdir(f"/proc/{pid}/task")
        kids = [int(k) for t in tasks for k in Path(f"/proc/{pid}/task/{t}/children").read_text().split()]
    except (FileNotFoundError, ProcessLookupError, TypeError):
        return 0, 0, 0
    cpu[pid] = (int(stat[11]) + int(stat[12])) / TICKS  # user and system
    below = [tree_memory(kid, cpu) for kid in kids]
    return rss + sum(b[0] for b in below), pss + sum(b[1] for b in below), max([hwm] + [b[2] for b in below])


def measure(cmd, env=None):
    """Run cmd: its record (wall s, peak MB of its largest process and of its tree) and its timed lines."""
    began, lines, tree, load, cpu = time.monotonic(), [], (0, 0, 0), round(os.getloadavg()[0], 2), {}
    env = {**os.environ, "PYTHONPATH": str(ROOT), "TQDM_DISABLE": "1", **(env or {})}
    cmd = [str(part) for part in cmd]
    proc = subprocess.Popen(
        cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )

    def read():
        for line in proc.stdout:
            lines.append((time.monotonic() - began, line.rstrip()))

    reader = threading.Thread(target=read)
    reader.start()
    while not (done := os.wait4(proc.pid, os.WNOHANG))[0]:
        tree = tuple(map(max, tree, tree_memory(proc.pid, cpu)))
        time.sleep(0.1)
    proc.returncode = os.waitstatus_to_exitcode(done[1])
    reader.join()
    out = {"cmd": " ".join(cmd), "rc": proc.returncode, "wall_s": round(time.monotonic() - began, 2)}
    largest = max(done[2].ru_maxrss * 1024, tree[2])  # polled, or of a waited process
    out.update(peak_process_mb=round(largest / 2**20, 1), peak_tree_mb=round(tree[0] / 2**20, 1))
    out.update(peak_tree_pss_mb=round(tree[1] / 2**20, 1))
    cpu[proc.pid] = done[2].ru_utime + done[2].ru_stime  # its own, whole, and its waited children's
    out["cpu_s"] = round(sum(cpu.values()), 1)  # every process's, as last polled
    out["load_before_after"] = [load, round(os.getloadavg()[0], 2)]
    out["phases_s"] = {m[1]: float(m[2]) for _, line in lines if (m := PHASE.match(line))}
    if proc.returncode:
        print(f"FAILED (rc {proc.returncode}): {out['cmd']}\n" + "\n".join(line for _, line in lines[-15:]))
    return out, lines


def prepare(files, out, *flags):
    """A whole `python -m train.prepare` (a fresh --out): its record."""
    cmd = [sys.executable, "-m", "train.prepare", "--data", *files, "--out", out, "--errors", "replace"]
    return measure([*cmd, "--overwrite", *flags])[0]


def hf(job, **spec):
    """A `tokenizers` job in a child process (this file with --child): its record and the child's timing."""
    threads = {"RAYON_NUM_THREADS": str(spec.pop("threads", 2))}
    record, lines = measure([sys.executable, __file__, "--child", json.dumps({"job": job, **spec})], threads)
    return {**record, **json.loads(lines[-1][1])} if record["rc"] == 0 else record


def hf_tokenizer(folder, gpt1):
    """The same BPE as tinygpt's: a folder it saved (vocab.json, merges.txt), or GPT-1's release as
    transformers' OpenAIGPTTokenizerFast builds it (BERT's normalizer and word splitter, </w>)."""
    from tokenizers import Tokenizer, models, normalizers, pre_tokenizers

    if not gpt1:
        tokenizer = Tokenizer(models.BPE.from_file(f"{folder}/vocab.json", f"{folder}/merges.txt"))
        tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
        return tokenizer
    files = f"{folder}/encoder_bpe_40000.json", f"{folder}/vocab_40000.bpe"
    tokenizer = Tokenizer(models.BPE.from_file(*files, unk_token="<unk>", end_of_word_suffix="</w>"))
    tokenizer.normalizer = normalizers.BertNormalizer(lowercase=True)
    tokenizer.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    return tokenizer


def child(spec):
    """Train a ByteLevel BPE on the files, or encode them in batches of lines; prints its seconds."""
    import numpy as np
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers

    began, files, result = time.monotonic(), spec["files"], {}
    if spec["job"] == "train":
        tokenizer = Tokenizer(models.BPE())
        tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
        alphabet = pre_tokenizers.ByteLevel.alphabet()
        trainer = trainers.BpeTrainer(
            vocab_size=spec["vocab"], initial_alphabet=alphabet, show_progress=False
        )
        tokenizer.train(files, trainer)
        result["vocab"] = tokenizer.get_vocab_size()
    else:
        tokenizer, result["tokens"] = hf_tokenizer(spec["tokenizer"], spec["gpt1"]), 0
        with open(spec["ids"], "wb") as out:
            for path in files:
                with open(path, encoding="utf-8", errors="replace") as file:
                    while lines := file.readlines(2**20):
                        encodings = tokenizer.encode_batch(lines, add_special_tokens=False)
                        ids = np.fromiter((i for e in encodings for i in e.ids), dtype=np.uint16)
                        ids.tofile(out)
                        result["tokens"] += ids.size
    print(json.dumps({"seconds": round(time.monotonic() - began, 2), **result}))


def table(title, header, rows):
    print(f"\n{title}\n" + " | ".join(header), flush=True)
    for row in rows:
        cells = [
            f"{v:,.1f}" if isinstance(v, float) else f"{v:,}" if isinstance(v, int) else str(v) for v in row
        ]
        print(" | ".join(cells), flush=True)


def training(args, files, mb, runs):
    """1. tinygpt's counting + merging (from the whole prepares) beside tokenizers' trainer."""
    results, rows = [], []
    for vocab in args.vocabs:
        ours, theirs = runs[args.train_mb, vocab], hf("train", files=files[: args.train_mb], vocab=vocab)
        seconds = sum(ours["phases_s"].get(phase, 0.0) for phase in ("counting words", "merging"))
        results.append({"vocab": vocab, "tinygpt_s": seconds, "tinygpt_prepare": ours, "hf": theirs})
        merging = ours["phases_s"].get("merging", 0.0)
        rows.append(
            (
                vocab,
                seconds,
                merging,
                theirs.get("seconds", "failed"),
                ours["peak_tree_mb"],
                theirs["peak_tree_mb"],
            )
        )
    header = ["vocab", "tinygpt s (count + merge)", "of which merging", "tokenizers s"]
    header += ["tinygpt peak MB (whole prepare)", "tokenizers peak MB"]
    table(f"1. BPE training on {mb[args.train_mb]:.0f} MB, 2 workers / 2 threads", header, rows)
    return results


def encoding(args, files, mb):
    """2. MB/s of the encoding phase (a given tokenizer) beside tokenizers' encode_batch: the fastest
    of --repeats runs of each, the runs taken in turns, so that a slow spell of the machine (whose
    speed varies by a third) falls on every side."""
    bpe = args.workdir / f"ds-{args.sizes_mb[0]}-{args.vocabs[0]}" / "tokenizer"
    results, rows, some = [], [], files[: args.encode_mb]
    for name, flag, folder in [
        (f"BPE {args.vocabs[0]}", "--tokenizer", bpe),
        ("GPT-1", "--gpt1-tokenizer", GPT1),
    ]:
        spec = {"tokenizer": str(folder), "gpt1": name == "GPT-1", "ids": str(args.workdir / "hf.bin")}
        runs = {workers: [] for workers in (1, 2)}
        for _ in range(args.repeats):
            for workers in runs:
                ours = prepare(some, args.workdir / f"enc-{workers}", flag, folder, "--workers", workers)
                runs[workers].append((ours, hf("encode", files=some, threads=workers, **spec)))
        for workers, tried in runs.items():
            ours = min((r[0] for r in tried), key=lambda r: r["phases_s"].get("encoding", math.inf))
            theirs = min((r[1] for r in tried), key=lambda r: r.get("seconds", math.inf))
            rate = [
                mb[args.encode_mb] / s if s else 0.0
                for s in (ours["phases_s"].get("encoding"), theirs.get("seconds"))
            ]
            results.append(
                {"tokenizer": name, "workers": workers, "tinygpt_mb_s": rate[0], "hf_mb_s": rate[1]}
            )
            results[-1].update(tinygpt=ours, hf=theirs)
            results[-1]["seconds_of_each_run"] = {
                "tinygpt": [r[0]["phases_s"].get("encoding") for r in tried],
                "hf": [r[1].get("seconds") for r in tried],
            }
            results[-1]["tinygpt_cpu_s_of_each_run"] = [r[0]["cpu_s"] for r in tried]
            rows.append((name, workers, *rate, ours["cpu_s"]))
            rows[-1] += (ours["peak_tree_pss_mb"], theirs["peak_tree_pss_mb"])
    header = ["tokenizer", "workers", "tinygpt MB/s", "tokenizers MB/s", "tinygpt CPU s (all processes)"]
    header += ["tinygpt peak MB (PSS)", "tokenizers peak MB (PSS)"]
    title = f"2. Encoding {mb[args.encode_mb]:.0f} MB (tokenizers: the same vocab and merges)"
    table(f"{title}, the fastest of {args.repeats} runs", header, rows)
    return results


def pairs(args, files, mb):
    """2b. One worker against two on the BPE's encoding of --encode-mb files, in --pairs adjacent pairs,
    the order alternating: a swing of the machine's speed falls on both sides of a pair, and the CPU
    seconds of each side say whether the two workers did more work than one or only waited less."""
    bpe = args.workdir / f"ds-{args.sizes_mb[0]}-{args.vocabs[0]}" / "tokenizer"
    some, results, rows = files[: args.encode_mb], [], []
    for i in range(args.pairs):
        order = (1, 2) if i % 2 == 0 else (2, 1)
        runs = {
            w: prepare(some, args.workdir / f"enc-{w}", "--tokenizer", bpe, "--workers", w) for w in order
        }
        record = {"one_s": runs[1]["phases_s"].get("encoding"), "two_s": runs[2]["phases_s"].get("encoding")}
        record.update(one_cpu_s=runs[1]["cpu_s"], two_cpu_s=runs[2]["cpu_s"])
        record["two_against_one"] = record["one_s"] / record["two_s"] if record["two_s"] else 0.0
        results.append(record)
        rows.append((i + 1, *record.values()))
    median = statistics.median(record["two_against_one"] for record in results)
    title = f"2b. Encoding {mb[args.encode_mb]:.0f} MB with the BPE, one worker against two in adjacent pairs"
    header = ["pair", "one worker s", "two workers s", "CPU s, one", "CPU s, two", "two against one"]
    table(f"{title} (median {median:.2f}x)", header, rows)
    return results


def first_step(args):
    """4. train.pretrain on the largest dataset: seconds to the first line that says 'step'."""
    data, out = args.workdir / f"ds-{args.sizes_mb[-1]}-{args.vocabs[0]}", args.workdir / "pretrain"
    cmd = [
        sys.executable,
        "-m",
        "train.pretrain",
        "--data",
        data,
        "--steps",
        1,
        "--preset",
        "tiny",
        "--device",
    ]
    cmd += ["cpu", "--eval-windows", 1, "--sample-tokens", 0, "--out", out, "--overwrite"]
    record, lines = measure(cmd)
    seconds, line = next(((t, line) for t, line in lines if "step" in line.lower()), (None, None))
    table(
        f"4. train.pretrain on the {args.sizes_mb[-1]} MB dataset",
        ["first 'step' s", "wall s", "line"],
        [(seconds, record["wall_s"], line)],
    )
    return {
        **record,
        "first_step_s": seconds,
        "first_step_line": line,
        "output": [line for _, line in lines[-20:]],
    }


def extrapolate(args, mb, runs, results):
    """5. Minutes for 5 GB at the largest vocab: linear in bytes, and (an assumption) in the cores."""
    vocab, train, big = (
        args.vocabs[-1],
        runs[args.train_mb, args.vocabs[-1]],
        runs[args.sizes_mb[-1], args.vocabs[0]],
    )
    count = train["phases_s"]["counting words"] / mb[args.train_mb]
    encode = big["phases_s"]["encoding"] / mb[args.sizes_mb[-1]]
    hf_train = (
        next(r for r in results["training"] if r["vocab"] == vocab)["hf"]["seconds"] / mb[args.train_mb]
    )
    hf_encode = (
        1 / next(r for r in results["encoding"] if r["workers"] == 2 and r["tokenizer"] != "GPT-1")["hf_mb_s"]
    )
    rows = []
    for cores in (2, 8):
        ours = 5000 * (count + encode) * 2 / cores + train["phases_s"]["merging"]
        rows.append((f"tinygpt, {cores} cores", ours / 60, "extrapolated; merging kept at its measured time"))
        rows.append(
            (f"tokenizers, {cores} threads", 5000 * (hf_train + hf_encode) * 2 / cores / 60, "extrapolated")
        )
    how = "reference, not measured: GPT-2's fixed BPE in tiktoken (no training), datasets.map(num_proc=8)"
    rows.append(("nanoGPT data/openwebtext/prepare.py", "-", how))
    table(f"5. 5 GB: a BPE of {vocab} trained, then the corpus encoded", ["who", "minutes", "how"], rows)
    return [dict(zip(["who", "minutes", "how"], row)) for row in rows]


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--sizes-mb", type=int, nargs="+", default=[50, 200, 400], help="corpora of 1 MB files"
    )
    parser.add_argument(
        "--train-mb", type=int, help="the corpus training is timed on (default: largest <= 200)"
    )
    parser.add_argument("--encode-mb", type=int, default=50, help="the files encoding is timed on")
    parser.add_argument("--repeats", type=int, default=2, help="runs of each encoding, the fastest kept")
    only = "time the encoding alone (with the BPE of an earlier run's prepare of --sizes-mb's first)"
    parser.add_argument("--encoding-only", action="store_true", help=only)
    paired = "time only one worker against two, in N adjacent pairs (as --encoding-only, the BPE alone)"
    parser.add_argument("--pairs", type=int, metavar="N", help=paired)
    parser.add_argument("--single-mb", type=int, default=100, help="the size of the one-file corpus")
    parser.add_argument("--vocabs", type=int, nargs="+", default=[8192, 40478])
    parser.add_argument("--workdir", type=Path, default=Path("/tmp/prepare_bench"))
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, help="write the results as JSON here (after each part)")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        return child(json.loads(args.child))
    import tokenizers

    args.sizes_mb, work = sorted(args.sizes_mb), args.workdir
    args.train_mb = args.train_mb or max([s for s in args.sizes_mb if s <= 200] or args.sizes_mb[:1])
    wanted = [*args.sizes_mb, args.train_mb, args.encode_mb]
    files = [str(p) for p in make_corpus(work / "corpus", max([*wanted, args.single_mb]), args.seed)]
    single = work / f"single-{args.single_mb}.txt"
    if not single.exists():
        single.write_bytes(b"".join(Path(p).read_bytes() for p in files[: args.single_mb]))
    mb = {n: sum(os.path.getsize(p) for p in files[:n]) / 1e6 for n in wanted}
    machine = {
        "cpus": os.cpu_count(),
        "python": platform.python_version(),
        "tokenizers": tokenizers.__version__,
    }
    results = {"machine": machine, "args": {k: str(v) for k, v in vars(args).items()}, "corpus_mb": mb}
    print(f"corpus: {len(files)} files in {work / 'corpus'}; {single} {single.stat().st_size / 1e6:.1f} MB")

    def save(part, value):
        results[part] = value
        if args.out:
            args.out.parent.mkdir(parents=True, exist_ok=True)
            args.out.write_text(json.dumps(results, indent=1, default=str) + "\n")

    if args.pairs:
        return save("pairs", pairs(args, files, mb))
    if args.encoding_only:
        return save("encoding", encoding(args, files, mb))
    runs = {}  # (corpus MB, vocab) -> a whole prepare with 2 workers
    for size, vocab in [(s, args.vocabs[0]) for s in args.sizes_mb] + [
        (args.train_mb, v) for v in args.vocabs
    ]:
        if (size, vocab) not in runs:
            runs[size, vocab] = prepare(
                files[:size], work / f"ds-{size}-{vocab}", "--vocab-size", vocab, "--workers", 2
            )
            save("prepare", [{"corpus_mb": mb[s], "vocab": v, **r} for (s, v), r in runs.items()])
    save("training", training(args, files, mb, runs))
    save("encoding", encoding(args, files, mb))
    whole = {f"{s} files": runs[s, args.vocabs[0]] for s in args.sizes_mb}
    whole[f"one {args.single_mb} MB file"] = prepare(
        [single], work / "ds-single", "--vocab-size", args.vocabs[0], "--workers", 2
    )
    save("single_file", whole[f"one {args.single_mb} MB file"])
    rows = [
        (k, r["wall_s"], r["peak_process_mb"], r["peak_tree_mb"], r["peak_tree_pss_mb"])
        for k, r in whole.items()
    ]
    header = ["corpus (MB)", "wall s", "peak MB, largest process", "peak MB, all processes"]
    header += ["the same, shared pages once (PSS)"]
    table(f"3. A whole prepare, vocab {args.vocabs[0]}, 2 workers (goal: under 1,000 MB)", header, rows)
    save("pretrain_start", first_step(args))
    save("extrapolation_5gb", extrapolate(args, mb, runs, results))
    print(f"\nwrote {args.out}" if args.out else "")


if __name__ == "__main__":
    main()
