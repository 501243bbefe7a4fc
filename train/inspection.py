"""A look inside a model: python -m train.evaluate attention | summary.

The two commands:
    attention   the attention weights of every head of one layer, drawn as heatmaps over the
                tokens of a text (needs matplotlib: pip install 'tinygpt[plot]')
    summary     parameters and forward FLOPs per token, layer by layer
"""

import math
import os

import numpy as np

from autograd import backend

from . import cli
from .cli import add_device_argument, non_negative_int, open_run, positive_int
from .run_folder import save_figure

PLOT_NEEDS = "drawing attention maps needs matplotlib: pip install 'tinygpt[plot]'"


# ----- attention -------------------------------------------------------------------------------
def attention_weights(model, ids, layer):
    """The attention weights of every head of block `layer` for one sequence of token ids:
    (n_head, T, T), row t the distribution of position t over positions 0..t, as float64. The model
    should be in eval mode (no dropout)."""
    ids = model.tokens_embed.weight.xp.asarray([ids], dtype=np.int64)
    return backend.to_host(model.attention_weights(ids, layer).data)[0].astype(np.float64)


def token_labels(tokenizer, ids):
    """Each token as text, for the axes (spaces shown as '·', newlines as '\\n')."""
    return [tokenizer.decode([i]).replace(" ", "·").replace("\n", "\\n") for i in ids]


def draw_attention(weights, labels, title, path):
    """Save a grid of heatmaps, one per head, rows the attending tokens (queries), columns the attended
    (keys), on one colour scale [0, 1] with one colour bar, so heads compare. Returns the figure."""
    try:
        from matplotlib.figure import Figure
    except ImportError:
        raise ImportError(PLOT_NEEDS) from None
    n_head, size = len(weights), len(labels)
    rows, columns = math.ceil(n_head / 4), min(n_head, 4)
    cell = max(2.0, 0.16 * size)  # inches per panel: room for `size` 8-point labels
    figure = Figure(figsize=(cell * columns + 2, cell * rows + 1.5), layout="compressed")
    grid = figure.subplots(rows, columns, sharex=True, sharey=True, squeeze=False)
    for ax in grid.flat[n_head:]:
        ax.axis("off")  # the last row's spare cells
    for head, ax in enumerate(grid.flat[:n_head]):
        image = ax.imshow(weights[head], cmap="viridis", vmin=0, vmax=1)
        bottom, left = head + columns >= n_head, head % columns == 0  # no panel below / to the left
        ax.tick_params(labelsize=8, labelbottom=bottom, labelleft=left)
        ax.tick_params("x", labelrotation=90)
        ax.set_title(f"head {head}")
        ax.set(xlabel="key (attended to)" if bottom else "", ylabel="query (attending)" if left else "")
    grid[0, 0].set(xticks=range(size), xticklabels=labels, yticks=range(size), yticklabels=labels)
    figure.colorbar(image, ax=grid, shrink=min(1, 0.6 + 0.1 * rows), label="attention weight")
    figure.suptitle(title)
    save_figure(figure, path)
    return figure


def attention_arguments(parser):
    parser.add_argument("--text", required=True, type=cli.text, help="the text to run through the model")
    parser.add_argument("--layer", required=True, type=non_negative_int, help="the block, counted from 0")
    parser.add_argument("--out", required=True, metavar="FILE.png", help="where to save the figure")
    add_device_argument(parser)


@cli.subcommand(
    "attention",
    attention_arguments,
    help="heatmaps of the attention weights of every head of a layer",
    description="Draw the attention weights of every head of one layer over the tokens of a text "
    "(rows attend to columns; the causal mask leaves the upper triangle empty).",
)
def attention_command(parser, args):
    try:
        import matplotlib  # noqa: F401  (checked first: no point loading a model we cannot draw)
    except ImportError:
        parser.error(PLOT_NEEDS)
    from matplotlib.figure import Figure

    formats = Figure().canvas.get_supported_filetypes()
    if os.path.splitext(args.out)[1].lstrip(".").lower() not in formats:
        endings = ", ".join(f".{f}" for f in formats)
        parser.error(f"--out: {args.out}: not a figure's file name (end it in {endings})")
    cli.check_output_file(parser, "--out", args.out, args)
    model, tokenizer = open_run(parser, args.run, args.device)
    n_layer, n_ctx = model.config.n_layer, model.config.n_ctx
    if args.layer >= n_layer:
        parser.error(f"--layer {args.layer}: the model has blocks 0..{n_layer - 1}")
    ids = tokenizer.encode(args.text)
    if not ids:
        parser.error("--text: encodes to no tokens")
    if len(ids) > n_ctx:
        print(f"the text is {len(ids)} tokens; drawing its first n_ctx={n_ctx}")
        ids = ids[:n_ctx]
    weights = attention_weights(model, ids, args.layer)
    with cli.writing(parser, "--out"):
        draw_attention(weights, token_labels(tokenizer, ids), f"layer {args.layer} of {args.run}", args.out)
    print(f"wrote {args.out}: {len(weights)} heads of layer {args.layer} over {len(ids)} tokens")
    return weights


# ----- summary ---------------------------------------------------------------------------------
def layer_summary(model, context=None):
    """Rows (name, parameters, matmul FLOPs, attention FLOPs) of a forward pass per token, at a
    context of T = `context` tokens (default n_ctx).

    A matmul with a weight of n numbers costs 2n FLOPs per token (a multiply and an add each).
    Attention at context T adds 2·2·T·d per layer: scores q·k over T keys, then the weighted sum
    of T values, each T·d multiply-adds. Embedding look-ups, biases, LayerNorm, GELU and softmax
    are left out; the LM head shares the token embedding, so it adds FLOPs but no parameters.
    """
    config = model.config
    d, T = config.n_embd, context or config.n_ctx
    rows = [(name, getattr(model, name).weight.size, 0, 0) for name in ("tokens_embed", "positions_embed")]
    for i, block in enumerate(model.h):
        weights = [p for _, p in block.named_parameters()]
        matmul = 2 * sum(p.size for p in weights if p.ndim == 2)
        rows.append((f"h.{i}", sum(p.size for p in weights), matmul, 2 * 2 * T * d))
    rows.append(("lm head (tied to tokens_embed)", 0, 2 * config.vocab_size * d, 0))
    return rows


def summary_arguments(parser):
    context = "the context length at which attention is counted (default: n_ctx)"
    parser.add_argument("--context", type=positive_int, metavar="T", help=context)


@cli.subcommand(
    "summary",
    summary_arguments,
    help="parameters and FLOPs per token, layer by layer",
    description="A table of each layer's parameters and forward FLOPs per token: 2 per weight of each "
    "matmul, plus 2*2*T*d per layer for attention at a context of T tokens.",
)
def summary_command(parser, args):
    model, _ = open_run(parser, args.run, "cpu")
    config = model.config
    context = args.context or config.n_ctx
    rows = layer_summary(model, context)
    total = ("total", *(sum(row[i] for row in rows) for i in (1, 2, 3)))
    print(
        f"{config.n_layer} layers, {config.n_embd} wide, {config.n_head} heads, n_ctx {config.n_ctx}, "
        f"vocab {config.vocab_size}"
    )
    print(f"{'layer':32}{'parameters':>14}{'matmul FLOPs':>16}{'attention FLOPs':>17}{'FLOPs/token':>16}")
    for name, params, matmul, attention in [*rows, total]:
        print(f"{name:32}{params:>14,}{matmul:>16,}{attention:>17,}{matmul + attention:>16,}")
    print(
        f"FLOPs of one forward pass per token, attention at a context of T = {context} tokens"
        f"{' (n_ctx)' if context == config.n_ctx else ''}: each token attends to T positions, an upper "
        f"bound; under the causal mask a token at position t attends to t + 1, about T/2 on average. "
        f"A training step costs about 3 times the forward pass."
    )
    return {"rows": rows, "total": total, "context": context}


if __name__ == "__main__":  # here, not above: train.evaluate imports this module
    from train.evaluate import run_alone

    run_alone("attention", "summary")
