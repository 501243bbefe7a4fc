"""Task readers: hand-made files of each layout, bad rows, label maps, and the real files."""

import csv
import json
import re
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tinygpt.tokenizer import GPT1Tokenizer
from tinygpt.transformations import encode_examples
from train import task_files
from train.task_files import load_labels, read, save_labels
from train.tasks import NLI, TASKS

SHARED = Path(__file__).resolve().parents[2].parent / "shared"
GLUE = SHARED / "data" / "glue"
needs_shared = pytest.mark.skipif(not GLUE.is_dir(), reason="../shared/data/glue is absent")


def write(tmp_path, name, text, encoding="utf-8"):
    path = tmp_path / name
    path.write_bytes(text.encode(encoding))
    return path


# ----- each layout, by hand ----------------------------------------------------------------------
def test_sst2_reads_sentence_and_label(tmp_path):
    path = write(tmp_path, "train.tsv", "sentence\tlabel\nit 's a charming journey . \t1\nbleak \t0\n")
    data = read("sst2", path)
    assert data.kind == "classification" and data.labels == ["0", "1"] and data.skipped == {}
    assert data.examples == [
        {"text": "it 's a charming journey .", "label": 1},
        {"text": "bleak", "label": 0},
    ]
    assert data.metrics == ("accuracy",) and data.n_classes == 2


@pytest.mark.parametrize("task, name", [("sst2", "train.tsv"), ("rocstories", "cloze.csv")])
def test_a_field_past_the_csv_modules_limit_is_read_whole_and_the_limit_is_left_as_it_was(
    tmp_path, task, name
):
    """A review of 200,000 characters is a row like any other (the csv module stops at 131,072)."""
    long = "word " * 40_000 + "end"
    text = f"sentence\tlabel\n{long}\t1\nshort\t0\n"
    if task == "rocstories":
        text = f'{STORY_HEADER}\nid,"{long}",B,C,D,E,F,1\nid,A,B,C,D,E,F,2\n'
    limit = csv.field_size_limit()
    data = read(task, write(tmp_path, name, text))
    first = data.examples[0]
    assert len(data.examples) == 2 and long in first.get("text", first.get("context", ""))
    assert csv.field_size_limit() == limit
    skipped = read(
        task,
        write(
            tmp_path,
            name,
            text.replace("end", "end\tone too many" if task == "sst2" else 'end",one too many'),
        ),
        skip_bad_rows=True,
    )
    assert len(skipped.examples) == 1 and skipped.skipped == {"bad rows": 1}


def test_cola_has_no_header(tmp_path):
    path = write(tmp_path, "dev.tsv", "gj04\t1\t\tThe sailors rode.\ngj04\t0\t*\tRode the sailors the.\n")
    data = read("cola", path)
    assert data.examples == [
        {"text": "The sailors rode.", "label": 1},
        {"text": "Rode the sailors the.", "label": 0},
    ]
    assert data.metrics == ("mcc",)


def test_rte_reads_a_cell_that_opens_with_a_bare_quote(tmp_path):
    """With quoting on, the quote would swallow the tab and the next line; with it off, it is text."""
    path = write(
        tmp_path,
        "train.tsv",
        "index\tsentence1\tsentence2\tlabel\n"
        '0\t"We knew, said Haviland.\tHe is American.\tnot_entailment\n'
        "1\tA dog ran.\tAn animal ran.\tentailment\n",
    )
    data = read("rte", path)
    assert data.kind == "entailment" and data.labels == ["entailment", "not_entailment"]
    assert data.examples == [
        {"premise": '"We knew, said Haviland.', "hypothesis": "He is American.", "label": 1},
        {"premise": "A dog ran.", "hypothesis": "An animal ran.", "label": 0},
    ]


def test_qnli_puts_the_question_first(tmp_path):
    path = write(
        tmp_path, "dev.tsv", "index\tquestion\tsentence\tlabel\n0\tWho ran?\tA dog ran.\tentailment\n"
    )
    assert read("qnli", path).examples == [{"premise": "Who ran?", "hypothesis": "A dog ran.", "label": 0}]


def test_mnli_finds_its_columns_by_name(tmp_path):
    header = "index\tpromptID\tpairID\tgenre\tsentence1\tsentence2\tlabel1\tgold_label"
    path = write(
        tmp_path,
        "dev_matched.tsv",
        f"{header}\n0\t1\t1e\tfiction\tA.\tB.\tneutral\tneutral\n"
        f"1\t2\t2e\tfiction\tC.\tD.\tcontradiction\tcontradiction\n",
    )
    data = read("mnli", path)
    assert data.labels == ["contradiction", "entailment", "neutral"]
    assert [example["label"] for example in data.examples] == [2, 0]


def test_stsb_scores_are_numbers_and_have_no_label_map(tmp_path):
    header = "index\tgenre\tfilename\tyear\told_index\tsource1\tsource2\tsentence1\tsentence2\tscore"
    path = write(tmp_path, "dev.tsv", f"{header}\n0\tg\tf\t2012\t0\tnone\tnone\tA man.\tA person.\t4.750\n")
    data = read("stsb", path)
    assert data.examples == [{"text_a": "A man.", "text_b": "A person.", "score": 4.75}]
    assert data.labels is None and data.n_classes is None and data.metrics == ("pearson", "spearman")


def test_mrpc_header_is_read_through_its_byte_order_mark(tmp_path):
    path = write(
        tmp_path,
        "dev.tsv",
        '\ufeffQuality\t#1 ID\t#2 ID\t#1 String\t#2 String\n1\t13\t14\tHe said "no".\t"No," he said.\n',
    )
    data = read("mrpc", path)
    assert data.kind == "similarity" and data.metrics == ("accuracy", "f1")
    assert data.examples == [{"text_a": 'He said "no".', "text_b": '"No," he said.', "label": 1}]


def test_snli_leaves_out_rows_without_a_gold_label_and_counts_them(tmp_path):
    rows = [
        {"sentence1": "A.", "sentence2": "B.", "gold_label": "neutral"},
        {"sentence1": "C.", "sentence2": "D.", "gold_label": "-"},
        {"sentence1": "E.", "sentence2": "F.", "gold_label": "contradiction"},
    ]
    data = read("snli", write(tmp_path, "dev.jsonl", "".join(json.dumps(r) + "\n" for r in rows)))
    assert data.examples == [
        {"premise": "A.", "hypothesis": "B.", "label": 2},
        {"premise": "E.", "hypothesis": "F.", "label": 0},
    ]
    assert data.skipped == {task_files.NO_GOLD_LABEL: 1}


STORY_HEADER = ",".join(task_files.STORY_COLUMNS)


def test_story_cloze_joins_the_four_sentences_and_offers_the_two_endings(tmp_path):
    path = write(
        tmp_path,
        "cloze.csv",
        f"{STORY_HEADER}\n"
        'id1,Tom ran.,"He fell, hard.",He cried.,Mom came.,He smiled.,He flew.,1\n'
        "id2,A.,B.,C.,D.,E.,F.,2\n",
    )
    data = read("rocstories", path)
    assert data.kind == "multiple_choice" and data.labels is None and data.metrics == ("accuracy",)
    assert data.examples == [
        {
            "context": "Tom ran. He fell, hard. He cried. Mom came.",
            "choices": ["He smiled.", "He flew."],
            "label": 0,
        },
        {"context": "A. B. C. D.", "choices": ["E.", "F."], "label": 1},
    ]


def test_story_cloze_needs_its_header(tmp_path):
    with pytest.raises(ValueError, match="line 1: expected the header"):
        read("rocstories", write(tmp_path, "cloze.csv", "id,s1,s2,s3,s4,e1,e2,answer\n"))


def test_jsonl_of_each_layout(tmp_path):
    layouts = {
        "classification": [{"text": "good", "label": "pos"}, {"text": "bad", "label": "neg"}],
        "entailment": [
            {"premise": "A.", "hypothesis": "B.", "label": 2},
            {"premise": "C.", "hypothesis": "D.", "label": 0},
        ],
        "similarity": [
            {"text_a": "A.", "text_b": "B.", "score": 1.5},
            {"text_a": "C.", "text_b": "D.", "score": 3},
        ],
        "multiple_choice": [{"context": "A.", "choices": ["B.", "C.", "D."], "label": 2}],
    }
    for kind, rows in layouts.items():
        data = read("jsonl", write(tmp_path, f"{kind}.jsonl", "".join(json.dumps(r) + "\n\n" for r in rows)))
        assert data.kind == kind
    assert read("jsonl", tmp_path / "classification.jsonl").labels == ["neg", "pos"]
    assert [e["label"] for e in read("jsonl", tmp_path / "entailment.jsonl").examples] == [
        1,
        0,
    ]  # labels [0, 2]
    assert read("jsonl", tmp_path / "similarity.jsonl").metrics == ("pearson", "spearman")
    assert read("jsonl", tmp_path / "multiple_choice.jsonl").examples == layouts["multiple_choice"]


# ----- files to predict: no labels --------------------------------------------------------------
MNLI_TEST_COLUMNS = "promptID\tpairID\tgenre\tsentence1_binary_parse\tsentence2_binary_parse\tsentence1_parse"
SNLI_ROW = '{"sentence1": "A", "sentence2": "B", "gold_label": "neutral"}\n'
GLUE_TEST_FILES = [  # task, the columns after GLUE's test file's index, the cells of a row, its example
    ("sst2", "sentence", "A fine film .", {"text": "A fine film ."}),
    ("cola", "sentence", "The sailors rode.", {"text": "The sailors rode."}),
    ("rte", "sentence1\tsentence2", "A dog.\tAn animal.", {"premise": "A dog.", "hypothesis": "An animal."}),
    ("qnli", "question\tsentence", "Who ran?\tA dog.", {"premise": "Who ran?", "hypothesis": "A dog."}),
    (
        "mnli",
        f"{MNLI_TEST_COLUMNS}\tsentence2_parse\tsentence1\tsentence2",
        "31193\t31193n\tgovernment\t( A )\t( B )\t(ROOT A)\t(ROOT B)\tA.\tB.",
        {"premise": "A.", "hypothesis": "B."},
    ),
    (
        "stsb",
        "genre\tfilename\tyear\told_index\tsource1\tsource2\tsentence1\tsentence2",
        "main-news\theadlines\t2015\t0\tnone\tnone\tA man.\tA person.",
        {"text_a": "A man.", "text_b": "A person."},
    ),
    (
        "mrpc",
        "#1 ID\t#2 ID\t#1 String\t#2 String",
        "1089874\t1089925\tHe said no.\tNo, he said.",
        {"text_a": "He said no.", "text_b": "No, he said."},
    ),
]


@pytest.mark.parametrize("task, columns, cells, example", GLUE_TEST_FILES)
def test_a_glue_test_file_is_read_without_labels_keeping_its_index(tmp_path, task, columns, cells, example):
    path = write(tmp_path, "test.tsv", f"index\t{columns}\n7\t{cells}\n12\t{cells}\n")
    data = read(task, path)
    assert data.examples == [example, example] and data.ids == ["7", "12"] and not data.labelled
    assert data.labels == (list(TASKS[task].labels) if TASKS[task].labels else None)


def test_json_lines_without_labels_keep_their_ids(tmp_path):
    """A JSON line's id or idx, else its place; the label names a run was trained with are kept;
    a file's rows are all labelled or none."""
    rows = [{"id": "a", "text": "good"}, {"idx": 3, "text": "bad"}, {"text": "so so"}]
    path = write(tmp_path, "test.jsonl", "".join(json.dumps(row) + "\n" for row in rows))
    data = read("jsonl", path)
    assert data.examples == [{"text": "good"}, {"text": "bad"}, {"text": "so so"}] and data.ids == ["a", 3, 2]
    assert not data.labelled and data.labels is None
    assert read("jsonl", path, labels=["neg", "pos"]).labels == ["neg", "pos"]
    pairs = [{"text_a": "A.", "text_b": "B."}, {"context": "A.", "choices": ["B.", "C."]}]
    for row in pairs:
        assert read("jsonl", write(tmp_path, "pair.jsonl", json.dumps(row) + "\n")).examples == [row]
    snli = write(tmp_path, "snli.jsonl", '{"sentence1": "A.", "sentence2": "B.", "pairID": "x"}\n' * 2)
    data = read("snli", snli)
    assert data.examples == [{"premise": "A.", "hypothesis": "B."}] * 2 and data.ids == [0, 1]
    assert data.labels == list(NLI)
    for task, text, why in [
        ("jsonl", '{"text": "a", "label": "x"}\n{"text": "b"}\n', "line 2: fields text differ"),
        ("snli", '{"sentence1": "A", "sentence2": "B"}\n' + SNLI_ROW, "line 2: fields"),
        ("jsonl", '{"text": "a", "id": [1]}\n', "line 1: the id [1] must be a string or an integer"),
    ]:
        with pytest.raises(ValueError, match=re.escape(why)):
            read(task, write(tmp_path, "mixed.jsonl", text))


# ----- label maps ----------------------------------------------------------------------------------
@given(
    st.lists(st.integers(-5, 5), min_size=1, max_size=6, unique=True)
    | st.lists(st.text(min_size=1, max_size=4), min_size=1, max_size=6, unique=True)
)
def test_label_ids_are_the_sorted_label_names_and_survive_saving(tmp_path_factory, names):
    """A file's labels (all integers or all strings) get their sorted order's ids, which a saved
    label list gives back."""
    directory = tmp_path_factory.mktemp("labels")
    rows = [{"text": "x", "label": name} for name in reversed(names)]
    data = read("jsonl", write(directory, "train.jsonl", "".join(json.dumps(r) + "\n" for r in rows)))
    assert data.labels == sorted(names)
    assert [data.labels[e["label"]] for e in data.examples] == list(reversed(names))
    save_labels(data.labels, directory / "labels.json")
    assert load_labels(directory / "labels.json") == data.labels
    again = read("jsonl", directory / "train.jsonl", labels=load_labels(directory / "labels.json"))
    assert again.examples == data.examples


def test_a_dev_set_is_read_with_the_train_sets_labels(tmp_path):
    train = read(
        "jsonl", write(tmp_path, "train.jsonl", '{"text": "a", "label": "b"}\n{"text": "c", "label": "z"}\n')
    )
    dev = write(tmp_path, "dev.jsonl", '{"text": "a", "label": "z"}\n{"text": "c", "label": "y"}\n')
    with pytest.raises(ValueError, match=r"dev\.jsonl: line 2: unknown label 'y'"):
        read("jsonl", dev, labels=train.labels)
    assert read("jsonl", dev, labels=train.labels, skip_bad_rows=True).examples == [{"text": "a", "label": 1}]


def test_load_labels_refuses_anything_but_a_list_of_distinct_names(tmp_path):
    for text in ('{"a": 0}', '["a", "a"]', '[1, "1"]', "[true]", '[["a"]]', "[1.5]"):
        with pytest.raises(ValueError, match="distinct label names"):
            load_labels(write(tmp_path, "labels.json", text))
    for text, why in (
        ('["a",\n "b"', "line 2 column 5: not valid JSON"),
        ("caf\xe9", "line 1: not valid UTF-8"),
    ):
        path = write(tmp_path, "labels.json", text, encoding="latin-1")
        with pytest.raises(ValueError, match=rf"^{re.escape(str(path))}: {why}"):
            load_labels(path)


# ----- bad rows -----------------------------------------------------------------------------------
BAD_ROWS = [  # task, file name, text, why: the middle one of three rows is bad
    (
        "sst2",
        "train.tsv",
        "sentence\tlabel\ngood\t1\ntoo\tmany\t1\nfine\t0\n",
        "expected 2 tab-separated columns",
    ),
    ("sst2", "train.tsv", "sentence\tlabel\ngood\t1\nodd\t2\nfine\t0\n", "unknown label '2'"),
    ("cola", "dev.tsv", "s\t1\t\tGood.\ns\t1\tBad.\ns\t0\t*\tFine.\n", "expected 4 tab-separated columns"),
    (
        "rte",
        "dev.tsv",
        "index\tsentence1\tsentence2\tlabel\n0\tA\tB\tentailment\n1\tA\tB\tneutral\n2\tC\tD\tentailment\n",
        "unknown label 'neutral'",
    ),
    (
        "stsb",
        "dev.tsv",
        "sentence1\tsentence2\tscore\nA\tB\t1.0\nA\tB\thigh\nC\tD\t2\n",
        "'high' is not a number",
    ),
    (
        "snli",
        "dev.jsonl",
        '{"sentence1": "A", "sentence2": "B", "gold_label": "neutral"}\n{"sentence1": "A"\n'
        '{"sentence1": "A", "sentence2": "B", "gold_label": "entailment"}\n',
        "not valid JSON",
    ),
    (
        "snli",
        "dev.jsonl",
        '{"sentence1": "A", "sentence2": "B", "gold_label": "neutral"}\n{"sentence1": "A"}\n'
        '{"sentence1": "A", "sentence2": "B", "gold_label": "entailment"}\n',
        "no field 'sentence2'",
    ),
    (
        "rocstories",
        "cloze.csv",
        f"{STORY_HEADER}\nid,A,B,C,D,E,F,1\nid,A,B,C,D,E,F,3\nid,A,B,C,D,E,F,2\n",
        "unknown label '3'",
    ),
    (
        "rocstories",
        "cloze.csv",
        f"{STORY_HEADER}\nid,A,B,C,D,E,F,1\nid,A,B,C,D,E,1\nid,A,B,C,D,E,F,2\n",
        "expected 8 comma-separated columns",
    ),
    (
        "jsonl",
        "mine.jsonl",
        '{"text": "a", "label": 0}\n{"txt": "b", "label": 1}\n{"text": "c", "label": 1}\n',
        "match no task",
    ),
    (
        "jsonl",
        "mine.jsonl",
        '{"text": "a", "label": 0}\n{"premise": "b", "hypothesis": "c", "label": 1}\n'
        '{"text": "c", "label": 1}\n',
        "differ from the first row",
    ),
    (
        "jsonl",
        "mine.jsonl",
        '{"context": "a", "choices": ["b", "c"], "label": 0}\n'
        '{"context": "a", "choices": ["b", "c"], "label": 2}\n'
        '{"context": "a", "choices": ["b", "c"], "label": 1}\n',
        "not the index of one of the 2",
    ),
    (
        "jsonl",
        "mine.jsonl",
        '{"context": "a", "choices": ["b", "c"], "label": 0}\n'
        '{"context": "a", "choices": ["b", "c", "d"], "label": 0}\n'
        '{"context": "a", "choices": ["b", "c"], "label": 1}\n',
        "with 3 choices",
    ),
    (
        "jsonl",
        "mine.jsonl",
        '{"text_a": "a", "text_b": "b", "score": 1}\n{"text_a": "a", "text_b": "b", "score": "1"}\n'
        '{"text_a": "a", "text_b": "b", "score": 2}\n',
        "is not a number",
    ),
    (
        "jsonl",
        "mine.jsonl",
        '{"text": "a", "label": 0}\n{"text": ["b"], "label": 1}\n{"text": "c", "label": 1}\n',
        "must be strings",
    ),
    # values that would pass the reader and go wrong later: a score training cannot use, a label
    # that makes a class of its own, a field of the wrong type
    (
        "stsb",
        "dev.tsv",
        "sentence1\tsentence2\tscore\nA\tB\t1.0\nA\tB\tnan\nC\tD\t2\n",
        "nan is not a finite",
    ),
    (
        "stsb",
        "dev.tsv",
        "sentence1\tsentence2\tscore\nA\tB\t1.0\nA\tB\t-inf\nC\tD\t2\n",
        "-inf is not a finite",
    ),
    *(
        (
            "jsonl",
            "mine.jsonl",
            '{"text_a": "a", "text_b": "b", "score": 1}\n'
            f'{{"text_a": "a", "text_b": "b", "score": {score}}}\n'
            '{"text_a": "a", "text_b": "b", "score": 2}\n',
            "is not a finite number",
        )
        for score in ("NaN", "Infinity", "-1e400", "1" + "0" * 400)
    ),
    (
        "jsonl",
        "mine.jsonl",
        '{"text": "a", "label": 1}\n{"text": "b", "label": "1"}\n{"text": "c", "label": 0}\n',
        "the label '1' is a string, the first row's 1 an integer",
    ),
    (
        "jsonl",
        "mine.jsonl",
        '{"text": "a", "label": "x"}\n{"text": "b", "label": 1}\n{"text": "c", "label": "y"}\n',
        "the label 1 is an integer, the first row's 'x' a string",
    ),
    (
        "jsonl",
        "mine.jsonl",
        '{"text": "a", "label": 1}\n{"text": "b", "label": true}\n{"text": "c", "label": 0}\n',
        "the label True must be a string or an integer",
    ),
    (
        "snli",
        "dev.jsonl",
        '{"sentence1": "A", "sentence2": "B", "gold_label": "neutral"}\n'
        '{"sentence1": null, "sentence2": "B", "gold_label": "neutral"}\n'
        '{"sentence1": "A", "sentence2": "B", "gold_label": "entailment"}\n',
        "sentence1, sentence2 and gold_label must be strings",
    ),
    (
        "snli",
        "dev.jsonl",
        '{"sentence1": "A", "sentence2": "B", "gold_label": "neutral"}\n'
        '{"sentence1": "A", "sentence2": "B", "gold_label": ["neutral", "-"]}\n'
        '{"sentence1": "A", "sentence2": "B", "gold_label": "entailment"}\n',
        "sentence1, sentence2 and gold_label must be strings",
    ),
]


@pytest.mark.parametrize("task, name, text, why", BAD_ROWS)
def test_a_bad_row_stops_reading_with_the_file_and_line(tmp_path, task, name, text, why):
    path = write(tmp_path, name, text)
    line = 2 if task in ("cola", "snli", "jsonl") else 3  # a header line first, or none
    with pytest.raises(ValueError) as error:
        read(task, path)
    assert str(error.value).startswith(f"{path}: line {line}: ") and why in str(error.value)


@pytest.mark.parametrize("task, name, text, why", BAD_ROWS)
def test_a_bad_row_is_left_out_and_counted_when_skipping(tmp_path, task, name, text, why):
    path = write(tmp_path, name, text)
    data = read(task, path, skip_bad_rows=True)
    assert len(data.examples) == 2 and data.skipped == {"bad rows": 1}
    assert len(data.bad_rows) == 1 and why in data.bad_rows[0]


UNREADABLE = [  # task, file name, bytes whose line 3 cannot be read
    ("sst2", "train.tsv", b"sentence\tlabel\ngood\t1\nbad \xff\t0\n"),
    ("cola", "dev.tsv", b"s\t1\t\tGood.\ns\t1\t\tFine.\ns\t0\t*\tCaf\xe9.\n"),
    ("rocstories", "cloze.csv", STORY_HEADER.encode() + b"\nid,A,B,C,D,E,F,1\nid,A,B,C,D,\xe9,F,2\n"),
    ("snli", "dev.jsonl", b'{"sentence1": "A"}\n\n{"sentence1": "\xc3"}\n'),
    ("jsonl", "mine.jsonl", b'{"text": "a", "label": 0}\n{"text": "b", "label": 1}\n{"text": "\x80"}\n'),
]


@pytest.mark.parametrize("task, name, data", UNREADABLE)
def test_a_file_that_cannot_be_read_as_text_is_refused_with_the_line(tmp_path, task, name, data):
    """A byte that is not UTF-8 (a Latin-1 file, say): a ValueError naming the file and the line,
    also when bad rows are skipped."""
    path = tmp_path / name
    path.write_bytes(data)
    with pytest.raises(ValueError, match=rf"^{re.escape(str(path))}: line 3: "):
        read(task, path, skip_bad_rows=True)


@pytest.mark.parametrize(
    "task, name, text",
    [
        ("sst2", "train.tsv", "sentence\tlabel\r\nun café \t1\r\nbleak\t0\r\n"),
        ("rocstories", "cloze.csv", STORY_HEADER + "\r\nid,A,B,C,D,E é,F,1\r\n"),
        ("jsonl", "mine.jsonl", '{"text": "b", "label": 1}\r\n{"text": "café", "label": 0}\r\n'),
    ],
)
def test_a_latin1_file_with_crlf_line_ends_reads_with_its_encoding(tmp_path, task, name, text):
    """Refused as UTF-8, naming the line and what to pass; read with encoding="latin-1", the same
    examples as its UTF-8, LF twin's (no "\\r" left in a cell)."""
    twin = read(task, write(tmp_path, f"utf8-{name}", text.replace("\r\n", "\n")))
    path = write(tmp_path, name, text, encoding="latin-1")
    not_utf8 = rf"^{re.escape(str(path))}: line 2: not valid UTF-8 at byte \d+ .*encoding='latin-1'"
    with pytest.raises(ValueError, match=not_utf8):
        read(task, path)
    assert read(task, path, encoding="latin-1").examples == twin.examples
    assert "\ufffd" in json.dumps(read(task, path, errors="replace").examples, ensure_ascii=False)


def test_a_header_without_the_tasks_columns_and_an_unknown_task_are_refused(tmp_path):
    with pytest.raises(ValueError, match=r"line 1: the header has no column 'sentence1', 'sentence2'"):
        read("rte", write(tmp_path, "dev.tsv", "index\tpremise\thypothesis\tlabel\n"))
    with pytest.raises(ValueError, match="the task 'squad' is not one of sst2, "):
        read("squad", tmp_path / "dev.tsv")
    with pytest.raises(ValueError, match="no examples"):
        read("jsonl", write(tmp_path, "empty.jsonl", "\n"))


# ----- the real files -------------------------------------------------------------------------------
REAL = [  # task, file, examples (../shared/data/README.md), label names
    ("sst2", "sst2/train.tsv", 67349, ["0", "1"]),
    ("sst2", "sst2/dev.tsv", 872, ["0", "1"]),
    ("cola", "cola/train.tsv", 8551, ["0", "1"]),
    ("cola", "cola/dev.tsv", 1043, ["0", "1"]),
    ("rte", "rte/train.tsv", 2490, ["entailment", "not_entailment"]),
    ("rte", "rte/dev.tsv", 277, ["entailment", "not_entailment"]),
    ("qnli", "qnli/dev.tsv", 5463, ["entailment", "not_entailment"]),
    ("stsb", "stsb/train.tsv", 5749, None),
    ("stsb", "stsb/dev.tsv", 1500, None),
    ("mrpc", "mrpc/train.tsv", 3668, ["0", "1"]),
    ("mrpc", "mrpc/dev.tsv", 408, ["0", "1"]),
]


@needs_shared
@pytest.mark.parametrize("task, name, count, labels", REAL)
def test_the_real_glue_files_read_whole(task, name, count, labels):
    data = read(task, GLUE / name)
    assert len(data.examples) == count and data.labels == labels and data.skipped == {}
    texts = [
        value for example in data.examples for key, value in example.items() if key not in ("label", "score")
    ]
    assert all(isinstance(text, str) and text for text in texts)
    if labels is None:
        assert all(0 <= example["score"] <= 5 for example in data.examples)
    else:
        assert {example["label"] for example in data.examples} == set(range(len(labels)))


@needs_shared
def test_the_real_snli_subset_counts_its_rows_without_gold_label():
    path = GLUE / "snli_subset" / "snli_1.0_dev.first1289.jsonl"
    rows = [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]
    data = read("snli", path)
    assert len(rows) == 1289
    assert data.skipped == {task_files.NO_GOLD_LABEL: sum(row["gold_label"] == "-" for row in rows)}
    assert len(data.examples) == 1289 - data.skipped[task_files.NO_GOLD_LABEL]
    kept = [row for row in rows if row["gold_label"] != "-"]
    assert [data.labels[e["label"]] for e in data.examples] == [row["gold_label"] for row in kept]


@needs_shared
def test_the_real_rte_quote_and_mrpc_bom():
    rte = read("rte", GLUE / "rte" / "train.tsv").examples
    assert rte[50]["premise"].startswith('"Instead of action on crime,') and rte[50]["label"] == 0
    assert rte[51]["premise"] != rte[50]["premise"]
    mrpc = read("mrpc", GLUE / "mrpc" / "dev.tsv").examples
    assert mrpc[0]["text_b"] == '"The foodservice pie business does not fit our long-term growth strategy.'


@needs_shared
def test_real_pairs_cut_to_fit_a_short_context_are_counted():
    files = SHARED / "data" / "gpt1-bpe"
    tokenizer = GPT1Tokenizer.from_files(files / "encoder_bpe_40000.json", files / "vocab_40000.bpe")
    examples = read("rte", GLUE / "rte" / "dev.tsv").examples[:60]
    data = encode_examples(examples, "entailment", tokenizer, n_ctx=64)
    limit = 64 // 2 - 2
    too_long = sum(
        len(tokenizer.encode(e["premise"])) > limit or len(tokenizer.encode(e["hypothesis"])) > limit
        for e in examples
    )
    assert data.n_cut == too_long > 0
    assert max(len(ids) for seqs in data.sequences for ids in seqs) <= 64


# ----- every file of a task has the training file's layout ---------------------------------------
def test_a_file_of_another_layout_than_the_training_files_is_refused_at_its_first_row(tmp_path):
    train = read("jsonl", write(tmp_path, "train.jsonl", '{"text": "a", "label": "x"}\n'))
    rows = [
        '{"text": "b", "label": "x"}',
        '{"text": "c"}',
        '{"premise": "a", "hypothesis": "b", "label": "x"}',
    ]
    dev = write(tmp_path, "dev.jsonl", "\n".join(rows) + "\n")
    with pytest.raises(
        ValueError, match=re.escape(f"{dev}: line 3: fields hypothesis, label, premise, not the")
    ):
        read("jsonl", dev, train.labels, layout=train.layout)
    kept = read("jsonl", dev, train.labels, skip_bad_rows=True, layout=train.layout)
    assert kept.examples == [{"text": "b", "label": 0}] and kept.skipped == {
        "bad rows": 2
    }  # and a row to predict
    test = read("jsonl", write(tmp_path, "test.jsonl", '{"text": "c"}\n'), layout=train.layout)
    assert test.examples == [{"text": "c"}]  # a file to predict: the layout less the label


def test_scores_are_not_the_layout_of_a_file_of_labels(tmp_path):
    train = read("jsonl", write(tmp_path, "train.jsonl", '{"text_a": "a", "text_b": "b", "label": "x"}\n'))
    dev = write(tmp_path, "dev.jsonl", '{"text_a": "a", "text_b": "b", "score": 0.5}\n')
    with pytest.raises(ValueError, match="line 1: fields score, text_a, text_b, not the training examples'"):
        read("jsonl", dev, train.labels, layout=train.layout)


def test_a_folder_where_a_task_file_goes_is_named(tmp_path):
    (tmp_path / "dev.tsv").mkdir()
    with pytest.raises(ValueError, match=re.escape(f"{tmp_path / 'dev.tsv'}: a folder, not a file of sst2")):
        read("sst2", tmp_path / "dev.tsv")


def test_a_jsonl_files_kind_is_that_of_its_first_row_kept(tmp_path):
    """Found by the generated user errors: a first row of another layout, left out with
    skip_bad_rows, made the file's kind entailment, and its texts then had no premise."""
    train = read("jsonl", write(tmp_path, "train.jsonl", '{"text": "a", "label": "x"}\n'))
    rows = '{"premise": "a", "hypothesis": "b", "label": "x"}\n{"text": "b", "label": "x"}\n'
    dev = read("jsonl", write(tmp_path, "dev.jsonl", rows), train.labels, True, layout=train.layout)
    assert dev.kind == "classification" and dev.examples == [{"text": "b", "label": 0}]
