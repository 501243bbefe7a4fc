"""The starting point of a fine-tune: the pre-trained GPT and its tokenizer, the paper's three
task tokens added to the vocabulary, and the ablations that undo some of the pre-training.

--init-from may name
    a run folder                     its best/ (a fine-tune's best epoch), else its newest checkpoint,
                                     as GPT.from_pretrained takes it; and its tokenizer/ folder
    one weights folder in a run      that checkpoint (or best/) and the run's tokenizer/ folder
    an openai-gpt folder             config.json + model.safetensors (the Hugging Face layout);
                                     the tokenizer is given apart, as GPT-1's files or a BPE folder
"""

import os

import autograd as ag
from tinygpt import GPT
from tinygpt.heads import resize
from tinygpt.tokenizer import GPT1Tokenizer, load_tokenizer
from tinygpt.weights import run_of


def load_pretrained(folder, tokenizer_dir=None, gpt1_tokenizer_dir=None):
    """(GPT, tokenizer) from a weights folder (lifecycle.starting_weights: a run's checkpoint or best/, or an
    openai-gpt folder); the tokenizer folders are for the last. Errors name the folder that is wrong."""
    run_dir, model = run_of(folder), GPT.from_pretrained(folder)
    if run_dir:
        if tokenizer_dir or gpt1_tokenizer_dir:
            raise ValueError(
                f"{run_dir} is a run, whose tokenizer comes along: --tokenizer and --gpt1-tokenizer "
                f"are for an openai-gpt folder"
            )
        return model, load_tokenizer(os.path.join(run_dir, "tokenizer"))
    if gpt1_tokenizer_dir:
        return model, GPT1Tokenizer.from_folder(gpt1_tokenizer_dir)
    if tokenizer_dir:
        return model, load_tokenizer(tokenizer_dir)
    raise ValueError(
        f"{folder} is an openai-gpt folder, which holds no tokenizer: give --gpt1-tokenizer DIR "
        f"(GPT-1's {' + '.join(GPT1Tokenizer.FILES)}) or --tokenizer DIR"
    )


def prepare(model, tokenizer, seed, from_scratch=False, transfer_layers=None):
    """Make the pre-trained GPT ready for a task, in place; returns a line saying what was done.

    The tokenizer's task tokens get new embedding rows. --from-scratch then draws every weight
    afresh (the config and tokenizer stay: the paper's "no pre-training"); --transfer-layers K keeps
    the embeddings and blocks 0..K-1 and draws blocks K.. afresh (Figure 2, left). Fresh weights
    come from GPT's own initialisation, seeded by `seed`.
    """
    n_layer = model.config.n_layer
    if transfer_layers is not None and not 0 <= transfer_layers <= n_layer:
        raise ValueError(
            f"--transfer-layers {transfer_layers}: the model has {n_layer} blocks, "
            f"so K must lie in 0..{n_layer}"
        )
    ag.manual_seed(seed)
    added = resize(model, tokenizer)
    notes = [
        f"added {added} task tokens to the vocabulary"
        if added
        else "the vocabulary already holds the task tokens"
    ]
    if from_scratch or (transfer_layers is not None and transfer_layers < n_layer):
        fresh = GPT(model.config)
        if from_scratch:
            model.load_state_dict(fresh.state_dict())
            notes.append("every weight re-initialised (--from-scratch)")
        else:
            fresh_blocks = {
                name: array
                for name, array in fresh.state_dict().items()
                if name.startswith("h.") and int(name.split(".")[1]) >= transfer_layers
            }
            model.load_state_dict(fresh_blocks, strict=False)
            notes.append(
                f"kept the embeddings and {transfer_layers} of {n_layer} blocks, "
                f"re-initialised blocks {transfer_layers}..{n_layer - 1}"
            )
    return "; ".join(notes)
