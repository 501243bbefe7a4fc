"""Evaluate a trained model: python -m train.evaluate COMMAND --run DIR ...

    perplexity   token perplexity and bits per byte on text files
    zeroshot     the paper's zero-shot heuristics on a labelled file (train/zeroshot.py)
    attention    heatmaps of the attention weights of a layer (train/inspection.py)
    summary      parameters and FLOPs per token by layer (train/inspection.py)
    predict      a fine-tune's predictions on a file with or without labels (train/predict.py)

Each command is a body(parser, args) under train.cli.subcommand (see perplexity below), which gives
it a parser that starts with --run; a new one is such a body, listed in COMMANDS.
"""

import math
import sys

from tqdm import tqdm

from autograd import functional as F
from autograd.functional import IGNORE_INDEX
from autograd.tensor import no_grad

from . import cli, inspection, predict, zeroshot
from .cli import add_figure_arguments, check_json_folder, open_run, positive_int, write_results
from .data import next_token_batch, read_texts
from .lifecycle import perplexity


def read_tokens(paths, tokenizer, max_tokens=None, encoding="utf-8", errors="strict"):
    """(token ids, UTF-8 bytes) of files, folders of *.txt and globs, joined in order, their text
    read as tinygpt.files.read_text_files reads it.

    Each file is encoded on its own and the ids are concatenated. With max_tokens the stream is
    cut there, and the bytes of the file cut short are those its kept tokens decode to (exact for
    byte-level BPE; GPT-1's tokenizer decodes to lower-cased, re-spaced text, so close to it).
    """
    ids, n_bytes = [], 0
    for text in read_texts(paths, encoding, errors):
        file_ids = tokenizer.encode_ordinary(text)
        if max_tokens is not None and len(ids) + len(file_ids) > max_tokens:
            file_ids = file_ids[: max_tokens - len(ids)]
            text = tokenizer.decode(file_ids)
        ids += file_ids
        n_bytes += len(text.encode("utf-8"))
        if max_tokens is not None and len(ids) >= max_tokens:
            break
    return ids, n_bytes


def windows(ids, n_ctx):
    """Windows of up to n_ctx + 1 tokens, one starting every n_ctx tokens, as in training.

    A window's inputs are all its tokens but the last and its targets all but the first; the
    windows share one token at each seam, so their targets do not overlap and every token but the
    very first is predicted exactly once, the last partial window included.
    """
    return [ids[start : start + n_ctx + 1] for start in range(0, len(ids) - 1, n_ctx)]


def negative_log_likelihood(model, ids, batch_size):
    """Total negative log-likelihood in nats of ids[1:], each token given up to n_ctx before it.

    Windows go through the model batch_size at a time; a shorter last window is padded at the end,
    which the causal mask keeps from changing the positions before it. The model should be in eval
    mode (train.run_folder.load_run gives it so). A progress bar goes to stderr where it is a terminal.
    """
    chunks = windows(ids, model.config.n_ctx)
    total = 0.0
    with no_grad(), tqdm(total=len(chunks), unit="window", disable=None) as progress:
        for start in range(0, len(chunks), batch_size):
            batch = chunks[start : start + batch_size]
            inputs, targets = next_token_batch([(chunk, len(chunk) - 1) for chunk in batch])  # every target
            loss = F.cross_entropy(model(inputs), targets, ignore_index=IGNORE_INDEX, reduction="sum")
            total += float(loss.item())
            progress.update(len(batch))
    return total


def perplexity_arguments(parser):
    files = "text files, folders of *.txt, or glob patterns"
    parser.add_argument("--data", required=True, nargs="+", metavar="FILE", help=files)
    cli.add_text_arguments(parser)
    parser.add_argument(
        "--max-tokens", type=positive_int, help="evaluate only the first N tokens (default: all of them)"
    )
    add_figure_arguments(parser, batch_size=8, batched="windows")


@cli.subcommand(
    "perplexity",
    perplexity_arguments,
    help="token perplexity and bits per byte on text files",
    description="Token perplexity over windows of n_ctx + 1 tokens (every token but the first "
    "predicted once), and bits per byte (the negative log-likelihood in bits over the UTF-8 "
    "bytes of the text), which compares models with different tokenizers.",
)
def perplexity_command(parser, args):
    check_json_folder(parser, args)
    model, tokenizer = open_run(parser, args.run, args.device)
    with cli.reading(parser, "--data"):
        ids, n_bytes = read_tokens(args.data, tokenizer, args.max_tokens, args.encoding, args.errors)
    if len(ids) < 2:
        parser.error(f"--data: the text holds {len(ids)} token(s); at least 2 are needed to predict one")
    nll = negative_log_likelihood(model, ids, args.batch_size)
    tokens = len(ids) - 1
    results = {
        "perplexity": perplexity(nll / tokens),  # inf where e ** loss overflows
        "bits_per_byte": nll / math.log(2) / n_bytes,
        "loss": nll / tokens,
        "tokens": tokens,
        "bytes": n_bytes,
    }
    print(f"perplexity     {results['perplexity']:.4f}  (mean loss {results['loss']:.4f} nats per token)")
    print(f"bits per byte  {results['bits_per_byte']:.4f}")
    print(f"tokens         {tokens}  (predicted, of {len(ids)})")
    print(f"bytes          {n_bytes}  (UTF-8)")
    write_results(parser, args, results)
    return results


COMMANDS = [  # a launcher may add its own
    perplexity_command,
    zeroshot.zeroshot_command,
    inspection.attention_command,
    inspection.summary_command,
    predict.predict_command,
]


def run_alone(*names):
    """python -m train.<module>, of a module that holds commands of this one: its one command run as
    python -m train.evaluate NAME, or a usage error naming its commands (status 2)."""
    if len(names) == 1:
        main([names[0], *sys.argv[1:]])
        return
    module = sys.modules["__main__"].__spec__.name
    print(f"python -m {module}: error: run python -m train.evaluate {' | '.join(names)}", file=sys.stderr)
    sys.exit(2)


def build_parser():
    parser = cli.Parser(prog="python -m train.evaluate", description=__doc__.split("\n")[0])
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for command in COMMANDS:
        command.add_to(commands)
    return parser


def parse_args(argv):
    parser = build_parser()
    return parser, parser.parse_args(argv)


@cli.command(parse_args)
def main(parser, args):
    return args._subcommand(args)  # the command's body, bound to its parser by cli.subcommand


if __name__ == "__main__":
    main()
