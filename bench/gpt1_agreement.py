"""GPT-1 tokenizer: how often the built-in pipeline gives the original's ids, paragraph by paragraph.

    python bench/gpt1_agreement.py [--data FOLDER] [--examples 10] [--json PATH]

The original pipeline is ftfy.fix_text + text_standardize + spaCy's English tokenizer + lower case
+ BPE (GPT1Tokenizer(pretokenizer="spacy")); ours swaps ftfy and spaCy for tinygpt's own
fix_text and EnglishWordSplitter. Paragraphs come from the Gutenberg books (split on blank lines;
the Latin-1 books are decoded as Latin-1) and from WikiText-2 valid (one paragraph per line).
Prints, per source, the share of paragraphs whose ids are identical beside the 99% target,
examples of disagreements, and encoding speed. Needs `pip install spacy ftfy`.
"""

import argparse
import difflib
import json
import re
import time
from pathlib import Path

from tinygpt.tokenizer.gpt1 import GPT1Tokenizer

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_DATA = ROOT.parent / "shared" / "data"
TARGET_PERCENT = 99.0


def read_book(path):
    """A book as text: UTF-8 where it is valid, else Latin-1 (every byte is a character)."""
    data = path.read_bytes()
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        return data.decode("latin-1")


def gutenberg_paragraphs(folder):
    paragraphs = []
    for path in sorted(folder.glob("*.txt")):
        text = read_book(path).replace("\r\n", "\n")
        paragraphs += [part.strip() for part in re.split(r"\n\s*\n", text) if part.strip()]
    return paragraphs


def wikitext_paragraphs(path):
    return [line.strip() for line in path.read_text(encoding="utf-8").split("\n") if line.strip()]


def first_difference(ours, reference, text, context=4):
    """A one-line picture of where two tokenizations of `text` part: words around the change."""
    ours_words, reference_words = ours.words(text), reference.words(text)
    matcher = difflib.SequenceMatcher(a=reference_words, b=ours_words, autojunk=False)
    for tag, ref_start, ref_end, our_start, our_end in matcher.get_opcodes():
        if tag != "equal":
            before = reference_words[max(0, ref_start - context) : ref_start]
            return (
                f"...{' '.join(before)!r} then spaCy {reference_words[ref_start : ref_end + 1]} "
                f"vs ours {ours_words[our_start : our_end + 1]}"
            )
    return "same words, different ids"  # cannot happen: the same words give the same ids


def compare(ours, reference, paragraphs, n_examples):
    """Encode with both; count identical paragraphs, time them, and describe a few mismatches."""
    start = time.perf_counter()
    our_ids = ours.encode_batch(paragraphs)
    our_seconds = time.perf_counter() - start
    start = time.perf_counter()
    reference_ids = reference.encode_batch(paragraphs)
    reference_seconds = time.perf_counter() - start
    mismatches = [i for i, (a, b) in enumerate(zip(our_ids, reference_ids)) if a != b]
    megabytes = sum(len(text.encode("utf-8")) for text in paragraphs) / 1e6
    return {
        "paragraphs": len(paragraphs),
        "identical": len(paragraphs) - len(mismatches),
        "percent_identical": 100.0 * (len(paragraphs) - len(mismatches)) / len(paragraphs),
        "megabytes": megabytes,
        "builtin_mb_per_s": megabytes / our_seconds,
        "spacy_mb_per_s": megabytes / reference_seconds,
        "examples": [first_difference(ours, reference, paragraphs[i]) for i in mismatches[:n_examples]],
    }


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", type=Path, default=DEFAULT_DATA, help="the shared data folder")
    parser.add_argument("--examples", type=int, default=10, help="disagreements to show per source")
    parser.add_argument("--json", type=Path, help="also write the numbers to this file")
    args = parser.parse_args()
    bpe_folder = args.data / "gpt1-bpe"
    if not bpe_folder.is_dir():
        raise SystemExit(f"{bpe_folder}: no such folder (the benchmark reads ../shared/data)")
    files = (bpe_folder / "encoder_bpe_40000.json", bpe_folder / "vocab_40000.bpe")
    try:
        GPT1Tokenizer.from_files(*files, pretokenizer="spacy")
    except ImportError as error:
        raise SystemExit(f"{error} (the benchmark compares against them)") from None

    sources = {
        "gutenberg": gutenberg_paragraphs(args.data / "pretrain" / "gutenberg"),
        "wikitext-2 valid": wikitext_paragraphs(args.data / "pretrain" / "wikitext-2" / "valid.txt"),
    }
    results = {}
    for name, paragraphs in sources.items():
        ours = GPT1Tokenizer.from_files(*files)  # fresh word caches for each source's timing
        reference = GPT1Tokenizer.from_files(*files, pretokenizer="spacy")
        result = results[name] = compare(ours, reference, paragraphs, args.examples)
        verdict = "ok" if result["percent_identical"] >= TARGET_PERCENT else "BELOW TARGET"
        print(
            f"{name}: {result['identical']:,} of {result['paragraphs']:,} paragraphs identical = "
            f"{result['percent_identical']:.2f}% (target {TARGET_PERCENT:.0f}%: {verdict}); "
            f"encode {result['builtin_mb_per_s']:.2f} MB/s built-in, "
            f"{result['spacy_mb_per_s']:.2f} MB/s ftfy+spaCy ({result['megabytes']:.2f} MB)"
        )
        for example in result["examples"]:
            print(f"  {example}")
    if args.json:
        args.json.write_text(json.dumps({"target_percent": TARGET_PERCENT, "sources": results}, indent=2))
        print(f"wrote {args.json}")


if __name__ == "__main__":
    main()
