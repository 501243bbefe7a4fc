"""Continue a prompt with a trained model: python -m train.generate --run DIR --prompt TEXT

Prints the prompt followed by the generated continuation. --run takes a run folder (its newest
checkpoint is used) or one checkpoint folder inside a run. See tinygpt/generation.py for how
temperature, top-k, top-p, the key/value cache and the sliding window beyond n_ctx work.
"""

from tinygpt.generation import generate

from .cli import (
    Help,
    Parser,
    add_device_argument,
    add_run_argument,
    command,
    non_negative_int,
    open_run,
    positive_int,
    probability,
    temperature,
    text,
)


def build_parser():
    parser = Parser(prog="python -m train.generate", description=__doc__.split("\n")[0], formatter_class=Help)
    add_run_argument(parser)
    parser.add_argument("--prompt", required=True, type=text, help="the text to continue")
    parser.add_argument("--max-new-tokens", type=non_negative_int, default=100, help="tokens to generate")
    parser.add_argument(
        "--temperature",
        type=temperature,
        default=1.0,
        help="divides the logits; 0 always takes the most likely token",
    )
    every = " (default: among every token)"
    parser.add_argument("--top-k", type=positive_int, help=f"sample only among the k likeliest tokens{every}")
    parser.add_argument(
        "--top-p",
        type=probability,
        help=f"sample only among the smallest set of most likely tokens whose probability reaches p{every}",
    )
    same = "fixes the sampling, so the same seed gives the same text (default: fresh randomness)"
    parser.add_argument("--seed", type=non_negative_int, help=same)
    add_device_argument(parser)
    parser.add_argument(
        "--no-cache",
        action="store_true",
        help="recompute the whole sequence for every token (slower; the same tokens)",
    )
    return parser


def continuation(tokenizer, prompt_ids, new_ids):
    """The text the new ids add after the prompt, with the spacing the tokenizer puts between them:
    decoding the new ids alone would lose the space GPT-1's tokenizer puts between words. Both
    tokenizers decode a prompt to a prefix of what they decode the prompt and continuation to."""
    whole, head = tokenizer.decode(prompt_ids + new_ids), tokenizer.decode(prompt_ids)
    return whole[len(head) :]


def parse_args(argv):
    parser = build_parser()
    return parser, parser.parse_args(argv)


@command(parse_args)
def main(parser, args):
    model, tokenizer = open_run(parser, args.run, args.device)
    prompt_ids = tokenizer.encode(args.prompt)
    if not prompt_ids:
        parser.error(f"--prompt: {args.prompt!r} is empty after tokenization; give some text to continue")
    new_ids = generate(
        model,
        prompt_ids,
        args.max_new_tokens,
        temperature=args.temperature,
        top_k=args.top_k,
        top_p=args.top_p,
        seed=args.seed,
        use_cache=not args.no_cache,
    )
    print(args.prompt + continuation(tokenizer, prompt_ids, new_ids))


if __name__ == "__main__":
    main()
