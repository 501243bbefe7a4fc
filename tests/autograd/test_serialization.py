"""safetensors files written and read with NumPy alone (and ml_dtypes for bfloat16).

Round trips are checked bit for bit; the layout against the format's specification (8-byte length,
JSON header padded to 8 bytes, contiguous data); and reading against damaged and hand-made files:
any fault must be a SafetensorsError naming the file, never another exception or wrong arrays.
"""

import json
import os
import re
import string
import struct
from pathlib import Path

import ml_dtypes
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from autograd import nn, serialization
from autograd.serialization import SafetensorsError, load_file, load_file_with_metadata, save_file

BFLOAT16 = np.dtype(ml_dtypes.bfloat16)
# The safetensors dtype names this module reads and writes, and the arrays they mean (stored as
# little-endian bytes; bfloat16s as their 16-bit patterns).
FORMAT = {
    "F64": "<f8",
    "F32": "<f4",
    "F16": "<f2",
    "BF16": BFLOAT16,
    "I64": "<i8",
    "I32": "<i4",
    "I16": "<i2",
    "I8": "i1",
    "U64": "<u8",
    "U32": "<u4",
    "U16": "<u2",
    "U8": "u1",
    "BOOL": "?",
}
# Every dtype name the safetensors format defines (some are not read here, which is allowed).
SAFETENSORS_DTYPES = set(FORMAT) | {"F8_E4M3", "F8_E5M2"}

# Examples of one test reuse its tmp_path, each overwriting the same file.
reuses_tmp_path = settings(suppress_health_check=[HealthCheck.function_scoped_fixture])

SHAPES = hnp.array_shapes(min_dims=0, max_dims=3, min_side=0, max_side=5)
NAMES = st.text(max_size=12).filter(lambda name: name != "__metadata__")
JSON_SCALARS = (
    st.none()
    | st.booleans()
    | st.integers(-(2**70), 2**70)
    | st.floats(allow_nan=False)
    | st.text(max_size=8)
)
JSON_VALUES = st.recursive(
    JSON_SCALARS,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner, max_size=3),
    max_leaves=8,
)


def arrays_of(dtype):
    """Arrays of one dtype, any shape (0-d and zero-size included), any values (bfloat16s drawn as
    any 16-bit pattern)."""
    if np.dtype(dtype) == BFLOAT16:
        return hnp.arrays(np.uint16, SHAPES).map(lambda bits: bits.view(BFLOAT16))
    return hnp.arrays(np.dtype(dtype), SHAPES)


def stored_arrays():
    """Arrays of any dtype safetensors holds."""
    return st.sampled_from(list(FORMAT.values())).flatmap(arrays_of)


def format_name(dtype):
    """The safetensors name of an array's dtype."""
    names = {np.dtype(v): k for k, v in FORMAT.items()}
    return names[dtype if dtype == BFLOAT16 else dtype.newbyteorder("<")]


def stored_bytes(array):
    """What safetensors stores for an array: its values as little-endian bytes, bfloat16s as their
    bit patterns."""
    if array.dtype == BFLOAT16:
        array = array.view(np.uint16)
    return array.astype(array.dtype.newbyteorder("<")).tobytes()


def tensor_dicts(min_size=0):
    return st.dictionaries(NAMES, stored_arrays(), min_size=min_size, max_size=4)


def write_raw(path, header, data=b"", header_len=None):
    """Write a file by hand: 8-byte length, header (bytes, or an object written as JSON), data."""
    raw = header if isinstance(header, bytes) else json.dumps(header).encode()
    length = len(raw) if header_len is None else header_len
    Path(path).write_bytes(struct.pack("<Q", length) + raw + data)
    return path


def assert_same_bits(loaded, expected):
    assert loaded.dtype == expected.dtype and loaded.shape == expected.shape
    assert loaded.tobytes() == expected.tobytes()


def assert_agrees_with_file(path, tensors, metadata):
    """What was read is what the file's header says: names in order, dtype, shape and bytes."""
    raw = Path(path).read_bytes()
    (n,) = struct.unpack("<Q", raw[:8])
    header = json.loads(raw[8 : 8 + n].decode("utf-8"))
    data = raw[8 + n :]
    assert metadata == header.pop("__metadata__", {})
    assert list(tensors) == list(header)
    for name, entry in header.items():
        begin, end = entry["data_offsets"]
        array = tensors[name]
        assert isinstance(array, np.ndarray) and array.shape == tuple(entry["shape"])
        assert array.dtype.isnative and format_name(array.dtype) == entry["dtype"]
        assert stored_bytes(array) == data[begin:end]


def assert_read_or_refused(path):
    """Reading either gives arrays that agree with the header or raises SafetensorsError naming the file."""
    try:
        tensors, metadata = load_file_with_metadata(path)
    except SafetensorsError as error:
        assert str(path) in str(error)
    else:
        assert_agrees_with_file(path, tensors, metadata)


def assert_refused(path):
    with pytest.raises(SafetensorsError) as error:
        load_file(path)
    assert str(path) in str(error.value)


# ----------------------------------------------------------------------------------------------
@reuses_tmp_path
@given(tensor_dicts())
def test_round_trip_is_bitwise(tmp_path, tensors):
    """save_file then load_file gives the same names in the same order, dtypes, shapes and bits."""
    path = tmp_path / "t.safetensors"
    save_file(tensors, path)
    loaded = load_file(path)
    assert list(loaded) == list(tensors)
    for name, array in tensors.items():
        assert_same_bits(loaded[name], array)


@reuses_tmp_path
@given(
    st.sampled_from([">f8", ">f4", ">f2", ">i8", ">i4", ">i2"]).flatmap(
        lambda d: hnp.arrays(np.dtype(d), SHAPES)
    )
)
def test_big_endian_arrays_come_back_with_the_same_values(tmp_path, array):
    """Big-endian input is stored little-endian and read back in native order, values unchanged."""
    path = tmp_path / "t.safetensors"
    save_file({"x": array}, path)
    assert_same_bits(load_file(path)["x"], array.astype(array.dtype.newbyteorder("=")))


@reuses_tmp_path
@given(hnp.arrays(np.float32, hnp.array_shapes(min_dims=2, max_dims=2, min_side=0, max_side=6)))
def test_non_contiguous_arrays_are_saved_by_value(tmp_path, array):
    """Transposed and strided views are written as the values they show."""
    path = tmp_path / "t.safetensors"
    save_file({"t": array.T, "s": array[::2, ::-1]}, path)
    loaded = load_file(path)
    assert_same_bits(loaded["t"], np.ascontiguousarray(array.T))
    assert_same_bits(loaded["s"], np.ascontiguousarray(array[::2, ::-1]))


@reuses_tmp_path
@given(tensor_dicts(), st.dictionaries(st.text(), st.text(), max_size=5))
def test_metadata_round_trip(tmp_path, tensors, metadata):
    """load_file_with_metadata returns the string metadata that save_file was given ({} for none)."""
    path = tmp_path / "t.safetensors"
    save_file(tensors, path, metadata=metadata)
    loaded, read_metadata = load_file_with_metadata(path)
    assert read_metadata == metadata
    assert list(loaded) == list(tensors)


@reuses_tmp_path
@given(hnp.arrays(np.uint16, SHAPES))
def test_a_bf16_tensor_written_by_hand_reads_as_those_bfloat16s(tmp_path, bits):
    """BF16 data written by hand, 2-byte little-endian bit patterns (any: NaNs, infinities and
    subnormals too), reads back as ml_dtypes.bfloat16s with exactly those bits."""
    stored = b"".join(struct.pack("<H", int(pattern)) for pattern in bits.flat)
    header = {"b": {"dtype": "BF16", "shape": list(bits.shape), "data_offsets": [0, len(stored)]}}
    loaded = load_file(write_raw(tmp_path / "bf16.safetensors", header, stored))["b"]
    assert_same_bits(loaded, bits.view(BFLOAT16))


# How the format stores one 16-bit float, as the spec says: 2 little-endian bytes.
SPEC_BYTES = {
    "BF16": lambda value: struct.pack("<f", value)[2:],  # bfloat16: the upper half of a float32
    "F16": lambda value: struct.pack("<e", value),  # IEEE 754 half precision
}
HALF_ARRAYS = {
    "BF16": hnp.arrays(np.float32, SHAPES, elements=st.floats(width=32, allow_nan=False)).map(
        lambda values: values.astype(BFLOAT16)
    ),
    "F16": hnp.arrays(np.float16, SHAPES, elements=st.floats(width=16, allow_nan=False)),
}


@pytest.mark.parametrize("name", list(SPEC_BYTES))
@reuses_tmp_path
@given(data=st.data())
def test_bf16_and_f16_are_written_as_the_spec_says(tmp_path, name, data):
    """bfloat16 and float16 arrays are stored under BF16 and F16, each value as the spec's bytes."""
    array = data.draw(HALF_ARRAYS[name], label=name)
    path = tmp_path / "t.safetensors"
    save_file({"x": array}, path)
    raw = path.read_bytes()
    (n,) = struct.unpack("<Q", raw[:8])
    assert json.loads(raw[8 : 8 + n])["x"]["dtype"] == name
    assert raw[8 + n :] == b"".join(SPEC_BYTES[name](float(value)) for value in array.flat)


def test_a_bf16_checkpoint_loads_into_float32_parameters(tmp_path):
    """load_state_dict casts what load_file gives (bfloat16 here) to each parameter's dtype."""
    weights = {name: p.data.astype(BFLOAT16) for name, p in nn.Linear(3, 2).named_parameters()}
    save_file(weights, tmp_path / "model.safetensors")
    layer = nn.Linear(3, 2)
    layer.load_state_dict(load_file(tmp_path / "model.safetensors"))
    for name, p in layer.named_parameters():
        assert_same_bits(p.data, weights[name].astype(np.float32))


@reuses_tmp_path
@given(tensor_dicts(), st.dictionaries(st.text(), st.text(), max_size=2))
def test_layout_follows_the_format(tmp_path, tensors, metadata):
    """8-byte little-endian header length, a multiple of 8; JSON header with the format's dtype
    names and shapes; data offsets packed in order from 0 to the end of the file."""
    path = tmp_path / "t.safetensors"
    save_file(tensors, path, metadata=metadata)
    raw = path.read_bytes()
    (n,) = struct.unpack("<Q", raw[:8])
    assert n % 8 == 0
    header = json.loads(raw[8 : 8 + n].decode("utf-8"))
    assert header.pop("__metadata__", {}) == metadata
    position = 0
    for name, array in tensors.items():
        entry = header[name]
        assert entry["dtype"] == format_name(array.dtype)
        assert entry["shape"] == list(array.shape)
        assert entry["data_offsets"] == [position, position + array.nbytes]
        position += array.nbytes
    assert 8 + n + position == len(raw)
    assert_agrees_with_file(path, load_file(path), metadata)


def test_safetensors_package_reads_ours_and_we_read_its(tmp_path):
    """Files move both ways between this module and the reference `safetensors` package."""
    safetensors_numpy = pytest.importorskip("safetensors.numpy")
    from safetensors import safe_open

    rng = np.random.default_rng(0)
    tensors = {
        "w": rng.standard_normal((3, 4)).astype(np.float32),
        "i": np.arange(5, dtype=np.int64),
        "h": rng.standard_normal(7).astype(np.float16),
        "b": np.array([True, False]),
        "s": np.array(2.5),
        "e": np.zeros((0, 3), np.int8),
    }
    ours, theirs = tmp_path / "ours.safetensors", tmp_path / "theirs.safetensors"
    save_file(tensors, ours, metadata={"format": "pt"})
    for name, array in safetensors_numpy.load_file(str(ours)).items():
        assert_same_bits(array, tensors[name])
    with safe_open(str(ours), framework="np") as f:
        assert f.metadata() == {"format": "pt"}
    safetensors_numpy.save_file(tensors, str(theirs), metadata={"k": "v"})
    loaded, metadata = load_file_with_metadata(theirs)
    assert metadata == {"k": "v"} and set(loaded) == set(tensors)
    for name, array in tensors.items():
        assert_same_bits(loaded[name], array)


def float32_values_and_ties():
    """float32s of every kind but NaN, with halfway cases that bfloat16 rounds to even."""
    rng = np.random.default_rng(0)
    special = [0.0, -0.0, np.inf, -np.inf, 1e-40, -3e38, 3.4e38, 1 + 2**-8, 1 + 3 * 2**-8, -(1 + 2**-8)]
    random = rng.standard_normal(200) * np.exp(rng.uniform(-80, 80, 200))
    return np.concatenate([special, random]).astype(np.float32).reshape(3, 70)


def test_torch_makes_the_bfloat16s_our_bf16_files_hold():
    """The BF16 bytes written for float32 values cast to ml_dtypes.bfloat16 are PyTorch's own
    bfloat16s of those values (rounded to nearest even): torch reads them as the same numbers."""
    torch = pytest.importorskip("torch")
    values = float32_values_and_ties()
    theirs = torch.from_numpy(values).to(torch.bfloat16).view(torch.int16).numpy()
    assert stored_bytes(values.astype(BFLOAT16)) == theirs.astype("<i2").tobytes()


def test_safetensors_package_reads_our_bf16_and_we_read_its(tmp_path):
    """BF16 moves both ways between this module and the `safetensors` package's PyTorch side
    (its NumPy side has no bfloat16)."""
    torch = pytest.importorskip("torch")
    safetensors_torch = pytest.importorskip("safetensors.torch")
    values = float32_values_and_ties()
    ours, theirs = tmp_path / "ours.safetensors", tmp_path / "theirs.safetensors"
    save_file({"b": values.astype(BFLOAT16)}, ours)
    expected = torch.from_numpy(values).to(torch.bfloat16)
    read = safetensors_torch.load_file(str(ours))["b"]
    assert read.dtype == torch.bfloat16 and torch.equal(read.view(torch.int16), expected.view(torch.int16))
    safetensors_torch.save_file({"b": expected}, str(theirs))
    assert_same_bits(load_file(theirs)["b"], values.astype(BFLOAT16))


# ----------------------------------------------------------------------------------------------
class FailingWrites:
    """A file whose third write fails, as on a full disk."""

    def __init__(self, file):
        self.file, self.writes = file, 0

    def __enter__(self):
        return self

    def __exit__(self, *exc_info):
        self.file.close()

    def write(self, data):
        self.writes += 1
        if self.writes == 3:
            raise OSError("No space left on device")
        return self.file.write(data)

    def __getattr__(self, name):
        return getattr(self.file, name)


def fail_with(error):
    def fail(*args, **kwargs):
        raise error

    return fail


@pytest.mark.parametrize("failure", ["write", "fsync", "replace", "interrupt"])
def test_failed_save_leaves_the_old_file_whole_and_no_temporary(tmp_path, monkeypatch, failure):
    """A save over an existing file that fails midway (disk full while writing, fsync or rename
    failing, Ctrl-C) keeps the old file byte for byte and leaves nothing else behind."""
    path = tmp_path / "model.safetensors"
    save_file({"old": np.arange(6.0).reshape(2, 3)}, path, metadata={"v": "1"})
    before = path.read_bytes()
    expected = OSError
    if failure == "write":
        monkeypatch.setattr(
            serialization, "open", lambda *a, **k: FailingWrites(open(*a, **k)), raising=False
        )
    elif failure == "fsync":
        monkeypatch.setattr(os, "fsync", fail_with(OSError("I/O error")))
    elif failure == "replace":
        monkeypatch.setattr(os, "replace", fail_with(OSError("read-only file system")))
    else:
        monkeypatch.setattr(os, "fsync", fail_with(KeyboardInterrupt()))
        expected = KeyboardInterrupt
    with pytest.raises(expected):
        save_file({"new": np.ones((64, 64)), "more": np.zeros(10, np.int32)}, path)
    monkeypatch.undo()
    assert path.read_bytes() == before
    assert os.listdir(tmp_path) == ["model.safetensors"]


def test_successful_save_replaces_the_old_file_and_leaves_no_temporary(tmp_path):
    """Saving over a file replaces its contents; no temporary file is left."""
    path = tmp_path / "model.safetensors"
    save_file({"old": np.arange(3)}, path)
    save_file({"new": np.ones(2, np.float16)}, path)
    assert list(load_file(path)) == ["new"]
    assert os.listdir(tmp_path) == ["model.safetensors"]


@reuses_tmp_path
@given(
    st.sampled_from([np.complex64, np.complex128, object, "U3", "datetime64[s]", "V4"]),
    st.text(string.ascii_letters + string.digits + "._-", min_size=1, max_size=10),
)
def test_unsupported_dtype_on_save_is_a_type_error_naming_the_tensor(tmp_path, dtype, name):
    """Saving a dtype safetensors cannot hold raises TypeError naming the tensor, and writes nothing."""
    with pytest.raises(TypeError, match=re.escape(name)):
        save_file({"fine": np.zeros(2), name: np.zeros(3, dtype=dtype)}, tmp_path / "t.safetensors")
    assert os.listdir(tmp_path) == []


# ----------------------------------------------------------------------------------------------
def saved_file_bytes(tmp_path, tensors, metadata):
    path = tmp_path / "valid.safetensors"
    save_file(tensors, path, metadata=metadata)
    return path.read_bytes()


@reuses_tmp_path
@given(tensor_dicts(), st.dictionaries(st.text(max_size=4), st.text(max_size=4), max_size=2), st.data())
def test_truncated_file_is_refused(tmp_path, tensors, metadata, data):
    """Any proper prefix of a valid file is a SafetensorsError naming the file."""
    raw = saved_file_bytes(tmp_path, tensors, metadata)
    cut = data.draw(st.integers(0, len(raw) - 1), label="length kept")
    path = tmp_path / "cut.safetensors"
    path.write_bytes(raw[:cut])
    assert_refused(path)


@reuses_tmp_path
@given(tensor_dicts(), st.dictionaries(st.text(max_size=4), st.text(max_size=4), max_size=2), st.data())
def test_damaged_bytes_are_refused_or_read_as_the_header_says(tmp_path, tensors, metadata, data):
    """Overwriting or bit-flipping drawn bytes anywhere gives a SafetensorsError naming the file,
    or arrays that agree with the (damaged) header; never another exception."""
    raw = bytearray(saved_file_bytes(tmp_path, tensors, metadata))
    edits = data.draw(
        st.lists(
            st.tuples(st.integers(0, len(raw) - 1), st.booleans(), st.integers(0, 255)),
            min_size=1,
            max_size=4,
        ),
        label="edits (position, flip a bit?, value)",
    )
    for position, flip, value in edits:
        raw[position] = raw[position] ^ (1 << (value % 8)) if flip else value
    path = tmp_path / "damaged.safetensors"
    path.write_bytes(bytes(raw))
    assert_read_or_refused(path)


@reuses_tmp_path
@given(
    st.dictionaries(
        NAMES,
        st.fixed_dictionaries(
            {
                "dtype": st.sampled_from(sorted(SAFETENSORS_DTYPES)) | JSON_VALUES,
                "shape": st.lists(st.integers(-1, 4) | JSON_VALUES, max_size=3) | JSON_VALUES,
                "data_offsets": st.lists(st.integers(-1, 40), min_size=2, max_size=2) | JSON_VALUES,
            }
        ),
        max_size=3,
    )
    | JSON_VALUES,
    st.binary(max_size=40),
)
def test_arbitrary_headers_are_refused_or_read_as_they_say(tmp_path, header, data):
    """Headers drawn freely (right keys, any values; or any JSON at all) never cause another exception."""
    assert_read_or_refused(write_raw(tmp_path / "h.safetensors", header, data))


# Hand-made files with one bad field. Each strategy draws (header: bytes or JSON object, data, header length).
@st.composite
def valid_parts(draw, min_size=1):
    """A valid header (as a dict) and its data, for the bad-field strategies to spoil."""
    tensors = draw(st.dictionaries(NAMES, stored_arrays(), min_size=min_size, max_size=3))
    header, data = {}, b""
    for name, array in tensors.items():
        stored = stored_bytes(array)
        header[name] = {
            "dtype": format_name(array.dtype),
            "shape": list(array.shape),
            "data_offsets": [len(data), len(data) + len(stored)],
        }
        data += stored
    return header, data


def spoil_one_entry(draw, header, key, values):
    name = draw(st.sampled_from(sorted(header)))
    header[name][key] = draw(values)
    return header


@st.composite
def length_past_the_end(draw):
    header, data = draw(valid_parts(min_size=0))
    raw = json.dumps(header).encode()
    return raw, data, draw(st.integers(len(raw) + len(data) + 1, 2**64 - 1))


def parses_to_an_object(raw):
    try:
        return isinstance(json.loads(raw.decode("utf-8")), dict)
    except ValueError:
        return False


@st.composite
def not_json(draw):
    """Random bytes, or a valid header cut short."""
    header, data = draw(valid_parts(min_size=0))
    text = json.dumps(header).encode()
    cut_short = st.integers(0, len(text) - 1).map(lambda n: text[:n])
    return (
        draw(st.binary(max_size=30).filter(lambda raw: not parses_to_an_object(raw)) | cut_short),
        data,
        None,
    )


@st.composite
def not_an_object(draw):
    return draw(JSON_VALUES.filter(lambda v: not isinstance(v, dict))), b"", None


@st.composite
def duplicate_names(draw):
    header, data = draw(valid_parts())
    name = draw(st.sampled_from(sorted(header)))
    items = [f"{json.dumps(k)}: {json.dumps(v)}" for k, v in header.items()]
    items.insert(draw(st.integers(0, len(items))), f"{json.dumps(name)}: {json.dumps(header[name])}")
    return ("{" + ", ".join(items) + "}").encode(), data, None


@st.composite
def unknown_dtype(draw):
    header, data = draw(valid_parts())
    bad = JSON_VALUES.filter(lambda v: not (isinstance(v, str) and v in SAFETENSORS_DTYPES))
    return spoil_one_entry(draw, header, "dtype", bad), data, None


@st.composite
def bad_shape(draw):
    header, data = draw(valid_parts())
    bad_dim = (
        st.integers(max_value=-1)
        | st.floats()
        | st.booleans()
        | st.none()
        | st.text(max_size=3)
        | st.lists(st.integers(0, 3), max_size=2)
    )
    shapes = st.lists(st.integers(0, 4), max_size=3).flatmap(
        lambda good: st.tuples(st.integers(0, len(good)), bad_dim).map(
            lambda p: good[: p[0]] + [p[1]] + good[p[0] :]
        )
    )
    not_a_list = JSON_VALUES.filter(lambda v: not isinstance(v, list))
    return spoil_one_entry(draw, header, "shape", shapes | not_a_list), data, None


@st.composite
def offsets_out_of_range(draw):
    header, data = draw(valid_parts())
    n = len(data)
    bad = (
        st.tuples(st.integers(0, n), st.integers(n + 1, 2**70)).map(list)  # end past the data
        | st.tuples(st.integers(1, n + 1), st.integers(0, n))
        .filter(lambda p: p[0] > p[1])
        .map(list)  # begin > end
        | st.tuples(st.integers(max_value=-1), st.integers(0, n)).map(list)  # negative
        | st.lists(st.integers(0, n), max_size=4).filter(lambda v: len(v) != 2)  # not a pair
        | st.tuples(st.sampled_from([0.0, "0", None, False]), st.integers(0, n)).map(list)  # not integers
        | JSON_VALUES.filter(lambda v: not isinstance(v, list))
    )
    return spoil_one_entry(draw, header, "data_offsets", bad), data, None


@st.composite
def overlapping_offsets(draw):
    a, b = draw(st.integers(1, 16)), draw(st.integers(1, 16))
    start = draw(st.integers(0, a - 1))
    header = {
        "a": {"dtype": "U8", "shape": [a], "data_offsets": [0, a]},
        "b": {"dtype": "U8", "shape": [b], "data_offsets": [start, start + b]},
    }
    return header, bytes(max(a, start + b)), None


@st.composite
def gaps(draw):
    a, b, gap = draw(st.integers(0, 16)), draw(st.integers(0, 16)), draw(st.integers(1, 16))
    where = draw(st.sampled_from(["before", "between", "after"]))
    first = gap if where == "before" else 0
    second = first + a + (gap if where == "between" else 0)
    header = {
        "a": {"dtype": "U8", "shape": [a], "data_offsets": [first, first + a]},
        "b": {"dtype": "U8", "shape": [b], "data_offsets": [second, second + b]},
    }
    return header, bytes(second + b + (gap if where == "after" else 0)), None


@st.composite
def byte_count_not_shape_times_itemsize(draw):
    header, data = draw(valid_parts())
    name = draw(st.sampled_from(sorted(header)))
    entry = header[name]
    begin, end = entry["data_offsets"]
    itemsize = np.dtype(FORMAT[entry["dtype"]]).itemsize
    entry["shape"] = draw(
        st.lists(st.integers(0, 6), max_size=3).filter(lambda s: int(np.prod(s)) * itemsize != end - begin)
    )
    return header, data, None


@st.composite
def extra_or_missing_keys(draw):
    header, data = draw(valid_parts())
    name = draw(st.sampled_from(sorted(header)))
    if draw(st.booleans()):
        key = draw(st.text(max_size=8).filter(lambda k: k not in header[name]))
        header[name][key] = draw(JSON_VALUES)
    else:
        del header[name][draw(st.sampled_from(sorted(header[name])))]
    return header, data, None


@st.composite
def bad_metadata(draw):
    header, data = draw(valid_parts(min_size=0))
    non_string = JSON_VALUES.filter(lambda v: not isinstance(v, str))
    header["__metadata__"] = draw(
        st.dictionaries(st.text(max_size=4), st.text(max_size=4), max_size=2).flatmap(
            lambda good: st.tuples(st.text(max_size=4), non_string).map(lambda kv: {**good, kv[0]: kv[1]})
        )
        | JSON_VALUES.filter(lambda v: not isinstance(v, dict))
    )
    return header, data, None


BAD_FILES = {
    "header length past the end": length_past_the_end(),
    "not JSON": not_json(),
    "not an object": not_an_object(),
    "duplicate names": duplicate_names(),
    "unknown dtype": unknown_dtype(),
    "bad shape": bad_shape(),
    "offsets out of range": offsets_out_of_range(),
    "overlapping offsets": overlapping_offsets(),
    "gaps": gaps(),
    "byte count not shape * itemsize": byte_count_not_shape_times_itemsize(),
    "extra or missing keys": extra_or_missing_keys(),
    "metadata not strings": bad_metadata(),
}


@pytest.mark.parametrize("fault", list(BAD_FILES))
@reuses_tmp_path
@given(data=st.data())
def test_hand_made_file_with_a_bad_field_is_refused(tmp_path, fault, data):
    """Each kind of bad header field is a SafetensorsError that names the file."""
    header, payload, header_len = data.draw(BAD_FILES[fault], label=fault)
    assert_refused(write_raw(tmp_path / "bad.safetensors", header, payload, header_len))


@pytest.mark.parametrize("dtype", [["F32"], {"F32": 4}, 4, None, True])
def test_non_string_dtype_is_refused(tmp_path, dtype):
    """A dtype that is a list, object, number, null or bool is a SafetensorsError, not a TypeError."""
    header = {"x": {"dtype": dtype, "shape": [1], "data_offsets": [0, 4]}}
    assert_refused(write_raw(tmp_path / "bad.safetensors", header, bytes(4)))


@pytest.mark.parametrize("shape", [[0, 2**70], [0, 2**62], [2**63, 0], [0] * 65])
def test_empty_shape_numpy_cannot_hold_is_refused(tmp_path, shape):
    """A zero-size shape with a dimension or rank NumPy cannot represent is a SafetensorsError."""
    header = {"x": {"dtype": "F64", "shape": shape, "data_offsets": [0, 0]}}
    assert_refused(write_raw(tmp_path / "bad.safetensors", header))


def test_deeply_nested_header_is_refused(tmp_path):
    """A header of 100,000 nested brackets is a SafetensorsError, not a RecursionError."""
    assert_refused(write_raw(tmp_path / "bad.safetensors", b"[" * 100_000 + b"]" * 100_000))


@pytest.mark.parametrize("size", range(8))
def test_file_too_short_for_the_length_is_refused(tmp_path, size):
    """Files of 0 to 7 bytes cannot hold the header length."""
    path = tmp_path / "short.safetensors"
    path.write_bytes(bytes(size))
    assert_refused(path)
