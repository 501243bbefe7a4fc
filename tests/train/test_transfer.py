"""The start of a fine-tune (train/transfer.py): the tokenizer must be the pre-trained model's."""

import json

import pytest

from tinygpt import GPT, GPTConfig
from tinygpt.tokenizer import BPETokenizer
from train import finetune

TEXTS = ["the cat sat on the mat", "a dog ran far from the log"] * 5


@pytest.mark.parametrize("extra_rows", [-10, 5])
def test_finetune_refuses_a_tokenizer_of_another_size_with_both_sizes(tmp_path, capsys, extra_rows):
    """An openai-gpt folder whose embedding table has 10 rows fewer than the tokenizer has tokens
    (more than its 3 task tokens), or 5 more: a usage error naming both sizes, before training."""
    tokenizer = BPETokenizer.train(TEXTS, vocab_size=300)
    tokenizer.save(tmp_path / "tokenizer")
    rows = tokenizer.vocab_size + extra_rows
    GPT(GPTConfig(vocab_size=rows, n_ctx=16, n_embd=16, n_layer=1, n_head=2)).save_pretrained(
        tmp_path / "gpt"
    )
    data = tmp_path / "train.jsonl"
    data.write_text(
        "".join(json.dumps({"text": text, "label": i % 2}) + "\n" for i, text in enumerate(TEXTS))
    )
    arguments = ["--init-from", str(tmp_path / "gpt"), "--tokenizer", str(tmp_path / "tokenizer")]
    arguments += ["--task", "jsonl", "--train", str(data), "--dev", str(data), "--out", str(tmp_path / "run")]
    with pytest.raises(SystemExit) as stop:
        finetune.main([*arguments, "--epochs", "1", "--device", "cpu"])
    error = capsys.readouterr().err
    assert stop.value.code == 2
    assert (
        f"the tokenizer has {tokenizer.vocab_size} tokens and the model's embedding table {rows} rows"
        in error
    )
