"""Byte-level BPE speed: train GPT-1's vocabulary size on the Gutenberg books, then encode them.

    python bench/tokenizer_speed.py [--data FOLDER] [--vocab-size 40478] [--json PATH]

Prints training time beside the 60 s target and encoding speed beside the 1 MB/s target (3 MB/s
aimed for). Files that are not valid UTF-8 (two of the books are Latin-1) are skipped and listed,
as the tokenizer's reading policy is strict UTF-8.
"""

import argparse
import json
import platform
import time
from pathlib import Path

from tinygpt.files import find_text_files, read_text_files
from tinygpt.tokenizer.bpe import BPETokenizer

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_DATA = ROOT.parent / "shared" / "data" / "pretrain" / "gutenberg"
TRAIN_TARGET_S = 60.0
ENCODE_TARGET_MB_S = 1.0


def read_books(folder):
    """UTF-8 books of `folder`, and the files skipped with the reason."""
    texts, skipped = [], []
    for path in find_text_files(folder):
        try:
            texts += read_text_files(path)
        except ValueError as error:
            skipped.append(str(error))
    return texts, skipped


def time_encoding(tokenizer, texts):
    start = time.perf_counter()
    ids = tokenizer.encode_batch(texts)
    return time.perf_counter() - start, ids


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", type=Path, default=DEFAULT_DATA, help="folder of .txt books")
    parser.add_argument("--vocab-size", type=int, default=40478)
    parser.add_argument("--json", type=Path, help="also write the numbers to this file")
    args = parser.parse_args()
    if not args.data.is_dir():
        raise SystemExit(f"{args.data}: no such folder (the benchmark reads ../shared/data)")

    texts, skipped = read_books(args.data)
    megabytes = sum(len(text.encode("utf-8")) for text in texts) / 1e6
    print(f"corpus: {len(texts)} UTF-8 books, {megabytes:.2f} MB from {args.data}")
    for reason in skipped:
        print(f"  skipped {reason}")

    start = time.perf_counter()
    tokenizer = BPETokenizer.train(texts, args.vocab_size)
    train_s = time.perf_counter() - start

    cold_s, ids = time_encoding(tokenizer, texts)  # the word cache starts empty
    warm_s, _ = time_encoding(tokenizer, texts)  # every word is now cached
    round_trip = all(tokenizer.decode(book_ids) == text for book_ids, text in zip(ids, texts))
    tokens = sum(map(len, ids))

    results = {
        "machine": f"{platform.processor() or platform.machine()}, python {platform.python_version()}",
        "books": len(texts),
        "skipped": skipped,
        "corpus_mb": round(megabytes, 3),
        "vocab_size": tokenizer.vocab_size,
        "train_s": round(train_s, 2),
        "train_target_s": TRAIN_TARGET_S,
        "encode_cold_mb_s": round(megabytes / cold_s, 2),
        "encode_warm_mb_s": round(megabytes / warm_s, 2),
        "encode_target_mb_s": ENCODE_TARGET_MB_S,
        "tokens": tokens,
        "bytes_per_token": round(megabytes * 1e6 / tokens, 2),
        "round_trip": round_trip,
    }
    print(f"{'':28}{'measured':>12}{'target':>12}")
    print(f"{'train ' + str(tokenizer.vocab_size) + ' tokens (s)':28}{train_s:12.1f}{'<= 60':>12}")
    print(f"{'encode, cold cache (MB/s)':28}{results['encode_cold_mb_s']:12.2f}{'>= 1':>12}")
    print(f"{'encode, warm cache (MB/s)':28}{results['encode_warm_mb_s']:12.2f}{'>= 1':>12}")
    print(f"{tokens:,} tokens, {results['bytes_per_token']} bytes per token")
    print(f"decode(encode(book)) == book: {round_trip}")
    if args.json:
        args.json.write_text(json.dumps(results, indent=2) + "\n", encoding="utf-8")
        print(f"wrote {args.json}")


if __name__ == "__main__":
    main()
