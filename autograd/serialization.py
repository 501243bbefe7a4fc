"""safetensors files, read and written with NumPy and ml_dtypes alone (no pickle: files may come from anyone).

Layout: an 8-byte little-endian header length N, N bytes of JSON, then the raw bytes. The JSON
maps each name to {"dtype", "shape", "data_offsets": [begin, end]} (offsets into the bytes after
the header), plus an optional "__metadata__" of strings. Reading checks every field before it
touches the data, and any fault is a SafetensorsError that names the file.

BF16 tensors are ml_dtypes.bfloat16 arrays on both sides (stored as their 16-bit patterns), F16
tensors float16 arrays; a model's load_state_dict casts them to its float32 parameters.
"""

import json
import math
import os
import struct

import ml_dtypes
import numpy as np

from .backend import to_host

# safetensors dtype name -> numpy dtype of the stored bytes (little-endian; BF16 as bit patterns)
DTYPES = {"F64": "<f8", "F32": "<f4", "F16": "<f2", "BF16": "<u2", "I64": "<i8", "I32": "<i4", "I16": "<i2"}
DTYPES |= {"I8": "i1", "U64": "<u8", "U32": "<u4", "U16": "<u2", "U8": "u1", "BOOL": "?"}
NAMES = {np.dtype(v): k for k, v in DTYPES.items() if k != "BF16"}
BFLOAT16 = np.dtype(ml_dtypes.bfloat16)
MAX_HEADER_BYTES = 100 * 1024 * 1024


class SafetensorsError(ValueError):
    """A safetensors file that cannot be read as one."""


def save_file(tensors, path, metadata=None):
    """Write {name: array} (numpy or cupy) to `path` atomically: a crash leaves any old file whole."""
    header, arrays, offset = {}, [], 0
    if metadata:
        header["__metadata__"] = {str(k): str(v) for k, v in metadata.items()}
    for name, array in tensors.items():
        if name == "__metadata__":
            raise ValueError("save_file: '__metadata__' is reserved and cannot name a tensor")
        array = to_host(array)
        if not array.flags.c_contiguous:
            array = array.copy()
        if array.dtype == BFLOAT16:
            dtype, array = "BF16", array.view(np.uint16).astype("<u2", copy=False)
        elif array.dtype.newbyteorder("<") in NAMES:
            array = array.astype(array.dtype.newbyteorder("<"), copy=False)
            dtype = NAMES[array.dtype]
        else:
            refused = f"has dtype {array.dtype}, which safetensors cannot hold"
            raise TypeError(f"save_file: tensor {name!r} {refused}")
        header[name] = {
            "dtype": dtype,
            "shape": list(array.shape),
            "data_offsets": [offset, offset + array.nbytes],
        }
        arrays.append(array)
        offset += array.nbytes
    encoded = json.dumps(header, separators=(",", ":")).encode()
    encoded += b" " * (-len(encoded) % 8)  # keep the data 8-byte aligned
    temporary = f"{path}.tmp{os.getpid()}"
    try:
        with open(temporary, "wb") as f:
            f.write(struct.pack("<Q", len(encoded)))
            f.write(encoded)
            for array in arrays:
                f.write(array.tobytes())
            f.flush()
            os.fsync(f.fileno())
        os.replace(temporary, path)
    finally:
        if os.path.exists(temporary):
            os.remove(temporary)


def load_file(path):
    """{name: numpy array} from a safetensors file; BF16 tensors come back as ml_dtypes.bfloat16."""
    tensors, _ = load_file_with_metadata(path)
    return tensors


def load_file_with_metadata(path):
    """({name: numpy array}, {metadata key: value}) from a safetensors file."""

    def fail(why):
        raise SafetensorsError(f"{path}: not a valid safetensors file: {why}")

    with open(path, "rb") as f:
        size = os.fstat(f.fileno()).st_size
        if size < 8:
            fail(f"{size} bytes is too short for the header length")
        (header_len,) = struct.unpack("<Q", f.read(8))
        if header_len > min(MAX_HEADER_BYTES, size - 8):
            fail(f"header length {header_len} runs past the end of the file ({size} bytes)")
        header = _parse_header(f.read(header_len), fail)
        data_len = size - 8 - header_len
        metadata = header.pop("__metadata__", {})
        entries = sorted((_check_entry(name, entry, data_len, fail), name) for name, entry in header.items())
        position = 0
        for (begin, end, _, _), name in entries:
            if begin != position:
                fail(f"tensor {name!r} starts at byte {begin}, expected {position} (overlap or gap)")
            position = end
        if position != data_len:
            fail(f"the tensors cover {position} bytes of data but the file holds {data_len}")
        tensors = {}
        for (begin, end, dtype, shape), name in entries:
            f.seek(8 + header_len + begin)
            try:
                array = np.frombuffer(f.read(end - begin), dtype=DTYPES[dtype]).reshape(shape)
            except ValueError as error:  # an empty shape numpy cannot hold, such as [0, 2**70]
                fail(f"tensor {name!r}: shape {list(shape)} ({error})")
            if dtype == "BF16":
                tensors[name] = array.astype("=u2").view(BFLOAT16)
            else:
                tensors[name] = array.astype(array.dtype.newbyteorder("="))
    return {name: tensors[name] for name in header}, metadata


def _parse_header(raw, fail):
    def no_duplicates(pairs):
        keys = [k for k, _ in pairs]
        if len(set(keys)) != len(keys):
            fail("the header names a tensor twice")
        return dict(pairs)

    try:
        header = json.loads(raw.decode("utf-8"), object_pairs_hook=no_duplicates)
    except (UnicodeDecodeError, json.JSONDecodeError, RecursionError) as error:
        fail(f"the header is not JSON ({error})")
    if not isinstance(header, dict):
        fail("the header is not a JSON object")
    metadata = header.get("__metadata__", {})
    if not isinstance(metadata, dict) or not all(isinstance(v, str) for v in metadata.values()):
        fail("__metadata__ must map strings to strings")
    return header


def _check_entry(name, entry, data_len, fail):
    """(begin, end, dtype, shape) of one header entry, after checking every field."""
    if not isinstance(entry, dict) or set(entry) != {"dtype", "shape", "data_offsets"}:
        fail(f"tensor {name!r} must have exactly dtype, shape and data_offsets")
    dtype, shape, offsets = entry["dtype"], entry["shape"], entry["data_offsets"]
    if not isinstance(dtype, str) or dtype not in DTYPES:
        fail(f"tensor {name!r} has unknown dtype {dtype!r}")
    if not isinstance(shape, list) or not all(type(n) is int and n >= 0 for n in shape):
        fail(f"tensor {name!r} has a bad shape {shape!r}")
    if (
        not isinstance(offsets, list)
        or len(offsets) != 2
        or not all(type(n) is int for n in offsets)
        or not 0 <= offsets[0] <= offsets[1] <= data_len
    ):
        fail(f"tensor {name!r} has data_offsets {offsets!r} outside the {data_len} data bytes")
    needed, given = math.prod(shape) * np.dtype(DTYPES[dtype]).itemsize, offsets[1] - offsets[0]
    if needed != given:
        fail(f"tensor {name!r}: {dtype} {shape} needs {needed} bytes, data_offsets give {given}")
    return offsets[0], offsets[1], dtype, tuple(shape)
