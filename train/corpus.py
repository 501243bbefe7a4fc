"""A text corpus on disk, read in bounded memory: which files are read, how each is cut into chunks
for the workers, and how a chunk is read in pieces and cut into documents.

No file is held whole. A chunk is a byte range of a file, at least CHUNK_BYTES long, that ends
where a line ends between two visible ASCII characters ("x\\ny"), neither of them "_" (which ends
the name of every special token, cut out before the text is split into words): a cut there cannot
change how any of tinygpt's tokenizers splits the text into words, so the ids of a document are the
same however it is cut. A chunk is read PIECE_BYTES at a time, decoded incrementally (a character cut at a
piece's end waits for its other bytes), its line ends made "\\n" as Python's text mode makes them,
and handed on up to its last such cut.
"""

import codecs
import glob
import hashlib
import re
from pathlib import Path

CHUNK_BYTES = 4 << 20  # a worker's unit of work, and one shard of token ids
PIECE_BYTES = 1 << 20  # read at a time
VISIBLE = frozenset(range(0x21, 0x7F)) - {ord("_")}  # "!" .. "~" but "_", which ends every special token
PARAGRAPH_BREAK = re.compile(r"\n(?:[^\S\n]*\n)+")  # a line end, then one or more blank lines


def find_sources(paths, extensions=(".txt",)):
    """(files to read, [(path, why it is not read)]) of files, folders and globs, each list sorted:
    a file named is read whatever its name; below a folder, the files ending in `extensions`.
    Links a folder or a glob holds and empty files (or only whitespace) are not read, and are named;
    a folder named like a text file is a ValueError."""
    files, skipped = set(), []
    for path in map(str, paths):
        if any(char in path for char in "*?["):
            matches = glob.glob(path, recursive=True)
            if not matches:
                raise ValueError(f"{path}: the pattern matches no file")
            skipped += [(match, "a link") for match in matches if Path(match).is_symlink()]
            found, passed = find_sources([m for m in matches if not Path(m).is_symlink()], extensions)
            files.update(found)
            skipped += passed
        elif Path(path).is_dir():
            for below in sorted(Path(path).rglob("*")):
                if below.is_dir() and below.name.endswith(tuple(extensions)):
                    raise ValueError(f"{below}: a folder, not a text file (rename it: every *.txt is read)")
                if below.is_symlink():
                    skipped.append((str(below), "a link"))
                elif below.is_file() and not below.name.endswith(tuple(extensions)):
                    skipped.append((str(below), f"not {' or '.join('*' + e for e in extensions)}"))
                elif below.is_file():
                    files.add(str(below))
        elif Path(path).is_file():
            files.add(path)
        else:
            raise FileNotFoundError(2, "no such file or folder", path)
    empty = sorted(path for path in files if blank(path))
    skipped += [(path, "empty") for path in empty]
    return sorted(files - set(empty)), sorted(set(skipped))


def blank(path):
    """Whether a file holds nothing but ASCII whitespace (read until its first other byte)."""
    with open(path, "rb") as file:
        while block := file.read(PIECE_BYTES):
            if not block.isspace():
                return False
    return True


def cuttable(encoding):
    """Whether a file in `encoding` may be cut at the bytes of a line end: UTF-8, or one byte a
    character (elsewhere the bytes of "\\n" may sit inside a character)."""
    name = codecs.lookup(encoding).name
    return name in ("utf-8", "utf-8-sig") or len(bytes(range(256)).decode(name, "replace")) == 256


def plan_chunks(path, encoding, paragraphs=False, on_bytes=lambda n: None, errors="strict"):
    """(the file's SHA-256, [(start, end, after_angle)], None or why it does not decode): byte
    ranges that tile the file, each ending at the first cut at least CHUNK_BYTES after its start
    ("x|\\ny"; with `paragraphs`, "x|\\n\\ny", so that every chunk begins a document), or at the
    file's end; after_angle: whether a "<" comes before the range (GPT-1's unicode fix keeps HTML
    entities after one). With errors="strict" the file is decoded too, and its first byte that
    does not decode named. `on_bytes(n)` hears of every n bytes read."""
    digest, chunks, offset, tail, angle = hashlib.sha256(), [[0, None, False]], 0, b"", False
    target = CHUNK_BYTES if cuttable(encoding) else float("inf")
    decoder, lines, problem = codecs.getincrementaldecoder(encoding)(), 1, None
    with open(path, "rb") as file:
        while block := file.read(PIECE_BYTES):
            digest.update(block)
            if errors == "strict" and not problem:
                problem = _decoding_problem(decoder, block, offset, lines, file.peek(1) == b"")
                lines += block.count(b"\n")
            if offset + len(block) > target:
                for i in _cuts_in(tail + block, paragraphs):
                    if (cut := offset - len(tail) + i) >= target:
                        chunks.append([cut, None, angle or b"<" in (tail + block)[:i]])
                        target = cut + CHUNK_BYTES
            angle = angle or b"<" in block
            offset, tail = offset + len(block), block[-3:]
            on_bytes(len(block))
    for chunk, following in zip(chunks, chunks[1:]):
        chunk[1] = following[0]
    chunks[-1][1] = offset
    problem = problem and f"{path}: {problem.replace('ENCODING', encoding.upper())}"
    return digest.hexdigest(), [tuple(chunk) for chunk in chunks], problem


def _decoding_problem(decoder, block, offset, lines, final):
    """Where `block` (at `offset`, after `lines` - 1 line ends) does not decode, or None."""
    waiting = len(decoder.getstate()[0])
    try:
        decoder.decode(block, final)
    except UnicodeDecodeError as error:
        byte = offset - waiting + error.start
        line = lines + block.count(b"\n", 0, max(byte - offset, 0))
        return f"line {line}: not valid ENCODING at byte {byte} ({error.reason})"
    return None


def _cuts_in(data, paragraphs):
    """The offsets i in `data` of each "\\n" (with `paragraphs`, "\\n\\n") between two visible characters."""
    line_end = b"\n\n" if paragraphs else b"\n"
    i = data.find(line_end, 1)
    while 0 < i < len(data) - len(line_end):
        if data[i - 1] in VISIBLE and data[i + len(line_end)] in VISIBLE:
            yield i
        i = data.find(line_end, i + 1)


def last_cut(text):
    """The offset of the last "\\n" of `text` between two VISIBLE characters (0: none)."""
    i = text.rfind("\n", 0, len(text) - 1)
    while i > 0:
        if ord(text[i - 1]) in VISIBLE and ord(text[i + 1]) in VISIBLE:
            return i
        i = text.rfind("\n", 0, i)
    return 0


def read_pieces(path, start, end, encoding="utf-8", errors="strict"):
    """The text of bytes start..end of a file in pieces, each ending before a cut (last_cut) or at
    `end`: a BOM at the file's start dropped, line ends made "\\n". A byte that does not decode
    (errors="strict") is a ValueError naming the file, its line and byte."""
    decoder = codecs.getincrementaldecoder(encoding)(errors)
    pending, offset, fresh = "", start, start == 0  # fresh: a BOM may come yet
    with open(path, "rb") as file:
        file.seek(start)
        while offset < end:
            block = file.read(min(PIECE_BYTES, end - offset))
            if not block:
                raise ValueError(f"{path}: the file became shorter while it was read")
            waiting = len(decoder.getstate()[0])  # bytes of a character the last block cut
            try:
                text = decoder.decode(block, final=offset + len(block) == end)
            except UnicodeDecodeError as error:
                raise undecodable(path, encoding, offset - waiting + error.start, error.reason) from None
            if fresh and text:
                text, fresh = text.removeprefix("\ufeff"), False
            offset += len(block)
            pending += text
            held = "\r" if offset < end and pending.endswith("\r") else ""  # its "\n" may come next
            pending = pending[: len(pending) - len(held)].replace("\r\n", "\n").replace("\r", "\n")
            cut = len(pending) if offset == end else last_cut(pending)
            if cut:
                yield pending[:cut]
            pending = pending[cut:] + held


def undecodable(path, encoding, byte, reason):
    """The error of a byte that does not decode, naming its line: the one tinygpt.files.read_text gives."""
    line = 1
    with open(path, "rb") as file:
        while block := file.read(min(PIECE_BYTES, byte - file.tell())):
            line += block.count(b"\n")
    return ValueError(f"{path}: line {line}: not valid {encoding.upper()} at byte {byte} ({reason})")


def document_parts(pieces, paragraphs, begins=True):
    """(text, begins_a_document) of each part of the pieces of a chunk, in order. With `paragraphs`
    a run of blank lines ends a document (the blank lines belong to neither); else the whole file
    is one document. `begins`: whether the chunk begins a document (a file's first one does; a
    chunk's start, "x\\n|y", is never a paragraph break). Empty parts are left out."""
    for piece in pieces:
        for index, text in enumerate(PARAGRAPH_BREAK.split(piece) if paragraphs else [piece]):
            begins = begins or index > 0
            if text:
                yield text, begins
                begins = False
