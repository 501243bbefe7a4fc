"""Fuzzing the loaders of every file a stranger may hand us, as test_serialization.py fuzzes
load_file: config.json, the tokenizers' files, the task files, label lists and a dataset's manifest.

Random bytes, or JSON of the wrong shape, in place of a file must load, or raise a ValueError or an
OSError whose message names the file: never another exception (TypeError, KeyError, RecursionError,
UnicodeDecodeError without a name...), never a crash, never a huge allocation.
"""

import json
import math

from hypothesis import given
from hypothesis import strategies as st

from tinygpt import GPT, GPTConfig
from tinygpt.tokenizer import BPETokenizer, GPT1Tokenizer
from train import dataset, task_files
from train.tasks import TASKS

JSON_SCALARS = (
    st.none()
    | st.booleans()
    | st.integers(-(2**70), 2**70)
    | st.floats()  # nan and infinities too: Python's json reads and writes them
    | st.text(max_size=8)
)
JSON_VALUES = st.recursive(
    JSON_SCALARS,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=10,
)
TEXT = st.text(alphabet="ab\t\n\r,\"'-é\x00 01.nafi", max_size=80)
CONTENTS = (  # what may be found in place of a file
    st.binary(max_size=300)
    | TEXT.map(str.encode)
    | JSON_VALUES.map(lambda value: json.dumps(value).encode())
    | st.builds(lambda value, n: json.dumps(value).encode()[:n], JSON_VALUES, st.integers(0, 40))  # cut short
)


def loads_or_names(load, path):
    """load() returns, or raises a ValueError or an OSError whose message names `path`; what it
    returned, or None."""
    try:
        return load()
    except (ValueError, OSError) as error:
        assert str(path) in str(error), f"{type(error).__name__} without {path}: {error}"
        return None


def write(path, contents):
    path.write_bytes(contents)
    return path


# ----- config.json ------------------------------------------------------------------------------
SMALL = GPTConfig(vocab_size=11, n_ctx=4, n_embd=8, n_layer=1, n_head=2)
FIELDS = [*SMALL.to_hf_dict(), "n_ctx"]
SIZES = st.integers(-2, 3) | st.integers(0, 2**64) | st.sampled_from([4, 8, 11, 32, 1024, 1025])


@st.composite
def configs(draw):
    """config.json: a good one with some fields changed (to any JSON value, or a size), or any JSON."""
    config = SMALL.to_hf_dict()
    for field in draw(st.lists(st.sampled_from(FIELDS), max_size=4)):
        config[field] = draw(JSON_VALUES | SIZES)
    return json.dumps(config).encode()


@given(contents=configs() | CONTENTS)
def test_config_json(tmp_path, contents):
    folder = tmp_path / "model"
    if not folder.is_dir():
        GPT(SMALL).save_pretrained(folder)
    write(folder / "config.json", contents)
    model = loads_or_names(lambda: GPT.from_pretrained(folder), folder)
    assert model is None or model.config.n_parameters == SMALL.n_parameters


# ----- tokenizer files -----------------------------------------------------------------------------
BPE_FILES = ("vocab.json", "merges.txt", "special_tokens.json", "tokenizer_config.json")


@given(name=st.sampled_from(BPE_FILES), contents=CONTENTS)
def test_bpe_tokenizer_files(tmp_path, name, contents):
    folder = tmp_path / "tokenizer"
    BPETokenizer.train(["a cat sat on a mat, a bat"], 256 + 3 + 8, normalizer="gpt1").save(folder)
    write(folder / name, contents)
    loads_or_names(lambda: BPETokenizer.load(folder), folder)


GPT1_ENCODER = {"<unk>": 0, "a": 1, "b": 2, "a</w>": 3, "b</w>": 4, "ab</w>": 5}


@given(which=st.sampled_from(GPT1Tokenizer.FILES), contents=CONTENTS)
def test_gpt1_tokenizer_files(tmp_path, which, contents):
    write(tmp_path / GPT1Tokenizer.FILES[0], json.dumps(GPT1_ENCODER).encode())
    write(tmp_path / GPT1Tokenizer.FILES[1], b"#version: 0.2\na b</w>\n")
    write(tmp_path / which, contents)
    loads_or_names(lambda: GPT1Tokenizer.from_folder(tmp_path), tmp_path)


# ----- task files and label lists ------------------------------------------------------------------
ROW_FIELDS = ["text", "label", "score", "premise", "hypothesis", "text_a", "text_b", "context", "choices"]
ROW_FIELDS += ["sentence1", "sentence2", "gold_label"]
JSON_ROWS = st.lists(st.dictionaries(st.sampled_from(ROW_FIELDS), JSON_VALUES, max_size=4), max_size=4).map(
    lambda rows: "".join(json.dumps(row) + "\n" for row in rows).encode()
)
TSV_ROWS = st.lists(
    st.lists(
        st.sampled_from(["sentence", "label", "score", "sentence1", "sentence2", "0", "1", "nan"]) | TEXT
    ),
    max_size=5,
).map(lambda rows: "".join("\t".join(cells) + "\n" for cells in rows).encode())


@given(
    task=st.sampled_from(tuple(TASKS)),
    contents=CONTENTS | JSON_ROWS | TSV_ROWS,
    skip_bad_rows=st.booleans(),
)
def test_task_files(tmp_path, task, contents, skip_bad_rows):
    """Whatever a file holds, what is read is usable: strings, finite scores, label ids in range."""
    path = write(tmp_path / "data", contents)
    dataset = loads_or_names(lambda: task_files.read(task, path, skip_bad_rows=skip_bad_rows), path)
    for example in dataset.examples if dataset else []:
        assert all(
            isinstance(example[field], str) for field in example if field not in ("label", "score", "choices")
        )
        if "score" in example:
            assert math.isfinite(example["score"])
        if "label" in example:
            bound = len(example["choices"]) if "choices" in example else dataset.n_classes
            assert type(example["label"]) is int and 0 <= example["label"] < bound


@given(contents=CONTENTS)
def test_label_lists(tmp_path, contents):
    path = write(tmp_path / "labels.json", contents)
    labels = loads_or_names(lambda: task_files.load_labels(path), path)
    assert labels is None or len({type(label) for label in labels}) <= 1


# ----- the token cache --------------------------------------------------------------------------
@given(
    contents=CONTENTS
    | JSON_VALUES.map(lambda value: json.dumps({"format": dataset.FORMAT, **{"shards": value}}).encode())
)
def test_dataset_manifest(tmp_path, contents):
    """A manifest of any other shape than train.prepare's is a ValueError naming it, never a shard
    read outside the folder."""
    write(tmp_path / dataset.MANIFEST, contents)
    try:
        dataset.Dataset(str(tmp_path))
    except ValueError as error:
        assert str(tmp_path) in str(error)  # the manifest, or a shard it names
