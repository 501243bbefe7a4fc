"""A corpus's bytes cut into chunks that a worker encodes alone, and a chunk's bytes read back as
its documents' text, a piece at a time.

No text is cut where cutting could change how the tokenizer splits it into words, so a document's
ids are exactly `encode_ordinary` of its whole text however it is cut. Where that is depends on the
tokenizer (`cuts_of`):

- "words", a byte-level BPE that splits with GPT-2's pattern alone: before a white space character
  that follows one that is not ("x| y", "x|\\ny"), where every word of the pattern ends; and in a
  stretch with none, between an ASCII letter or digit and ASCII punctuation other than "'" ("x|,").
- "lines", GPT-1's tokenizer or a BPE with its normalizer, whose unicode fix works a line at a time
  (an HTML tag anywhere in a line keeps its entities, mojibake is read again line by line): before
  the white space that holds a line end ("x|  \\ny", which its clean-up makes one " \\n " however
  wide); and in a line longer than a piece, at a space between two visible ASCII characters ("x| y")
  where the line is ASCII without "&", which gives the fix nothing to do. A longer line with none
  is held whole.

The part of a document after a cut is encoded behind an anchor whose ids are then dropped (see
shards.encode_task). A chunk is at least CHUNK_BYTES long, and read PIECE characters at a time:
no piece held exceeds that by more than a word (a line, where "lines" finds no cut in it).
Line ends (CRLF, CR) are read as "\\n", as Python's text mode reads them.
"""

import codecs
import contextlib
import functools
import json
from typing import NamedTuple

import regex

from tinygpt.tokenizer.bpe import GPT2_PATTERN

CHUNK_BYTES = 4 << 20  # a chunk: a worker's unit of work, and of what a Ctrl-C loses
PIECE = 1 << 20  # characters (and bytes) read and encoded at a time
PARAGRAPH_BREAK = regex.compile(r"\n(?:[^\S\n]*\n)+")  # a line end, then one or more blank lines
CUTS = {  # searched from the end
    "words": regex.compile(r"(?<=\S)(?=\s)", flags=regex.REVERSE),
    "lines": regex.compile(r"(?<=[!-~])(?=[ \t]*\n)", flags=regex.REVERSE),
}
SPACE_CUT = regex.compile(r"(?<=[!-~])(?= [!-~])", flags=regex.REVERSE)
BOUND_CUT = regex.compile(r"(?<=[A-Za-z0-9])(?=[!-&(-/:-@\[-`{-~])", flags=regex.REVERSE)
BYTE_CUTS = {  # the same in bytes (ASCII white space only), and JSON lines' record ends
    "words": regex.compile(rb"(?<=[^\t-\r ])(?=[\t-\r ])"),
    "lines": regex.compile(rb"(?<=[!-~])(?=[\t ]*[\r\n])"),
    "paragraphs": regex.compile(
        rb"(?<=[^\t-\r ])(?=(?:\r\n|\r(?!\n)|\n)(?:[\t\v\f ]*(?:\r\n|\r(?!\n)|\n))+)"
    ),
    "records": regex.compile(rb"(?<=\n)(?=.)", flags=regex.DOTALL),
}
BYTE_BOUND_CUT = regex.compile(rb"(?<=[A-Za-z0-9])(?=[!-&(-/:-@\[-`{-~])")


class Chunk(NamedTuple):
    """Bytes start..end of a source's stream (rows start..end of a Parquet file): what one worker
    encodes. begins: whether a document begins at its start; angle: whether a "<" comes before it
    in the source (GPT-1's unicode fix keeps HTML entities after one); line: the line it starts on."""

    start: int
    end: int
    begins: bool = True
    angle: bool = False
    line: int = 1


def cuts_of(tokenizer):
    """Where the tokenizer's text may be cut (see the module's docstring): "words" or "lines"."""
    plain = (
        getattr(tokenizer, "normalizer", "gpt1") is None
        and getattr(tokenizer, "pattern", None) == GPT2_PATTERN
    )
    return "words" if plain else "lines"


@functools.lru_cache
def cuttable(encoding):
    """Whether a file in `encoding` may be cut at the bytes of an ASCII character: UTF-8, or one byte a
    character that spells ASCII as ASCII does (elsewhere such bytes may sit inside a character, or
    stand for another: EBCDIC's)."""
    name, ascii_bytes = codecs.lookup(encoding).name, bytes(range(128))
    one_byte = len(bytes(range(256)).decode(name, "replace")) == 256
    return (
        name in ("utf-8", "utf-8-sig")
        or one_byte
        and ascii_bytes.decode(name, "replace") == ascii_bytes.decode()
    )


class Planner:
    """Cuts a source's stream, fed to it a block at a time, into chunks: each ends at the first cut
    at least `chunk_bytes` after its start, or at the stream's end. `kind`: "records" (JSON lines),
    "paragraphs", or the tokenizer's `cuts` ("words", "lines"); a chunk of paragraphs ends before a
    blank line where one comes within `chunk_bytes` more, else at a cut of `cuts`; with "words", a
    stretch of twice that without white space ends at a bound. With errors="strict" the stream
    is decoded too, and its first byte that does not decode named (`problem`)."""

    def __init__(self, kind, cuts, encoding, errors, chunk_bytes=CHUNK_BYTES):
        self.kind, self.cuts, self.encoding, self.size = kind, cuts, encoding, chunk_bytes
        self.chunks, self.offset, self.tail, self.angle, self.lines = [Chunk(0, 0)], 0, b"", False, 1
        self.target = chunk_bytes if cuttable(encoding) else float("inf")
        self.decoder = codecs.getincrementaldecoder(encoding)() if errors == "strict" else None
        self.problem, self.blank = None, True  # blank: nothing but ASCII white space so far

    def feed(self, block):
        data, base = self.tail + block, self.offset - len(self.tail)
        while (found := self.first_cut(data, base)) is not None:
            cut, kind = found
            line = (
                self.lines + data.count(b"\n", len(self.tail), cut) - data.count(b"\n", cut, len(self.tail))
            )
            begins = kind in ("records", "paragraphs")
            self.chunks.append(Chunk(base + cut, 0, begins, self.angle or b"<" in data[:cut], line))
            self.target = base + cut + self.size
        if self.decoder and not self.problem:
            self.problem = decoding_problem(self.decoder, block, self.offset, self.lines)
        self.angle = self.angle or b"<" in block
        self.blank = self.blank and (block.isspace() or not block)
        self.lines += block.count(b"\n")
        self.offset += len(block)
        self.tail = data[-8:]

    def first_cut(self, data, base):
        """(offset in `data`, kind) of the first cut at the target or after, not at data's end; or None."""
        at, past = max(self.target - base, 4), base + len(data) - self.target  # 4: a character before
        if at >= len(data):
            return None
        kinds = [self.kind]
        if self.kind == "paragraphs" and past >= self.size and self.cuts == "words":
            kinds.append("words")  # (with "lines", no: a "<" in the paragraph before it would be lost)
        if self.cuts == "words" and self.kind != "records" and past >= 2 * self.size:
            kinds.append("bound")
        for kind in kinds:
            pattern = BYTE_BOUND_CUT if kind == "bound" else BYTE_CUTS[kind]
            for match in pattern.finditer(data, at):
                if match.start() < len(data) and not (
                    kind not in ("records", "bound")
                    and white_space_before(data, match.start(), self.encoding)
                ):
                    return match.start(), kind
        return None

    def finish(self):
        """The chunks, the last ending at the stream's end."""
        if self.decoder and not self.problem:
            self.problem = decoding_problem(self.decoder, b"", self.offset, self.lines, final=True)
        ends = [chunk.start for chunk in self.chunks[1:]] + [self.offset]
        return [Chunk(c.start, end, c.begins, c.angle, c.line) for c, end in zip(self.chunks, ends)]


def white_space_before(data, i, encoding):
    """Whether the character before byte i is white space (a non-ASCII one, such as U+00A0)."""
    return bool(regex.fullmatch(r"\s", data[max(i - 4, 0) : i].decode(encoding, "ignore")[-1:] or "x"))


def decoding_problem(decoder, block, offset, lines, final=False):
    """Where `block` (at `offset`, after `lines` - 1 line ends) does not decode, or None."""
    waiting = len(decoder.getstate()[0])
    try:
        decoder.decode(block, final)
    except UnicodeDecodeError as error:
        byte = offset - waiting + error.start
        line = lines + block.count(b"\n", 0, max(byte - offset, 0))
        return f"line {line}: not valid ENCODING at byte {byte} ({error.reason})"
    return None


def last_cut(text, cuts, line_is_clean=lambda line: False):
    """The offset of the last cut in `text` (0: none; never its very end). Where there is no cut
    of a line end or, for "words", white space, and `text` is longer than a piece: the last space
    of its last line, for "lines" where line_is_clean(that line); the last bound, for "words"."""
    found = CUTS[cuts].search(text)
    if found or len(text) <= PIECE:
        return found.start() if found else 0
    if cuts == "lines":
        line_start = text.rfind("\n") + 1
        if not line_is_clean(text[line_start:]):
            return 0
        found = SPACE_CUT.search(text, line_start)
    else:
        found = BOUND_CUT.search(text)
    return found.start() if found else 0


def clean(text):
    """Whether GPT-1's unicode fix leaves a line as it is however it is cut: ASCII, and no "&"."""
    return text.isascii() and "&" not in text


def read_range(path, start, end):
    """Bytes start..end of a file."""
    with open(path, "rb") as file:
        file.seek(start)
        data = file.read(end - start)
    if len(data) != end - start:
        raise ValueError(f"{path}: shorter than when it was read; run the same command again")
    return data


def read_pieces(data, start, cuts, encoding="utf-8", errors="strict", where=("", 1)):
    """The text of a chunk's bytes (`data`, from byte `start` of its stream) in pieces, each ending
    before a cut (last_cut) or at the end: a BOM at the stream's start dropped, line ends made "\\n".
    A byte that does not decode (errors="strict") is a ValueError naming the file (where: its path
    and the chunk's first line), its line and byte."""
    if len(data) <= PIECE:  # the whole chunk at once: a small file, most of a corpus of many
        with undecodable(where, data, start, encoding, 0):
            text = data.decode(encoding, errors)
        yield (text.removeprefix("\ufeff") if start == 0 else text).replace("\r\n", "\n").replace("\r", "\n")
        return
    decoder = codecs.getincrementaldecoder(encoding)(errors)
    pending, offset, fresh = "", 0, start == 0  # fresh: a BOM may come yet

    def rest_of_line_is_clean(line):
        ends = [i for i in (data.find(b"\n", offset), data.find(b"\r", offset)) if i >= 0]
        rest = data[offset : min(ends, default=len(data))]
        return clean(line) and rest.isascii() and b"&" not in rest

    while offset < len(data):
        block = data[offset : offset + PIECE]
        waiting = len(decoder.getstate()[0])  # bytes of a character the last block cut
        with undecodable(where, data, start, encoding, offset - waiting):
            text = decoder.decode(block, final=offset + len(block) == len(data))
        if fresh and text:
            text, fresh = text.removeprefix("\ufeff"), False
        offset += len(block)
        pending += text
        held = "\r" if offset < len(data) and pending.endswith("\r") else ""  # its "\n" may come next
        pending = pending[: len(pending) - len(held)].replace("\r\n", "\n").replace("\r", "\n")
        cut = len(pending) if offset == len(data) else last_cut(pending, cuts, rest_of_line_is_clean)
        if cut:
            yield pending[:cut]
        pending = pending[cut:] + held


@contextlib.contextmanager
def undecodable(where, data, start, encoding, at):
    """Within: a byte that does not decode, `at` bytes into the chunk `data` where the error's offset
    begins, is a ValueError naming the file (where: its path and the chunk's first line), line, byte."""
    try:
        yield
    except UnicodeDecodeError as error:
        line, byte = where[1] + data.count(b"\n", 0, at + error.start), start + at + error.start
        raise ValueError(
            f"{where[0]}: line {line}: not valid {encoding.upper()} at byte {byte} ({error.reason})"
        ) from None


def pieces_of(text, cuts):
    """A document's text held whole (a JSON record, a Parquet row) in pieces, as read_pieces cuts:
    each ends at the last cut within a piece's length, or else of twice that, and so on."""
    size = PIECE
    while len(text) > size:
        line_end = text.find("\n", size + 1)
        rest = text[size + 1 : line_end if line_end >= 0 else len(text)]  # of the line the window ends in
        if cut := last_cut(text[: size + 1], cuts, lambda line, rest=rest: clean(line + rest)):
            yield text[:cut]
            text, size = text[cut:], PIECE
        else:
            size *= 2
    yield text


def document_parts(pieces, paragraphs, begins=True):
    """(text, begins_a_document) of each part of the pieces of a chunk of text, in order. With
    `paragraphs` a run of blank lines ends a document (the blank lines belong to neither); else the
    whole file is one. `begins`: whether the chunk begins a document. Empty parts are left out."""
    for piece in pieces:
        for index, text in enumerate(PARAGRAPH_BREAK.split(piece) if paragraphs else [piece]):
            begins = begins or index > 0
            if text:
                yield text, begins
                begins = False


def records(data, key, cuts, encoding, errors, where):
    """(text, begins_a_document) of the pieces of each record of a chunk of JSON lines: the string
    under `key` of each line's object; a blank line, and a record whose text is null or empty, are
    left out. A line that is not such a record is a ValueError naming the file and line."""
    for number, line in enumerate(data.split(b"\n"), start=where[1]):
        at = f"{where[0]}: line {number}"
        try:
            text = line.decode(encoding, errors).removeprefix("\ufeff")
            record = json.loads(text) if text.strip() else {key: None}
        except UnicodeDecodeError as error:
            raise ValueError(f"{at}: not valid {encoding.upper()} ({error.reason})") from None
        except (ValueError, RecursionError) as error:
            raise ValueError(f"{at}: not a JSON record ({error})") from None
        if not isinstance(record, dict):
            raise ValueError(f"{at}: a JSON {json_kind(record)}, not a record (an object)")
        if key not in record:
            raise ValueError(f"{at}: no {key!r} in it (--json-key names the text's field)")
        if not isinstance(record[key], (str, type(None))):
            raise ValueError(f"{at}: its {key!r} is a JSON {json_kind(record[key])}, not text")
        yield from text_parts(record[key] or "", cuts)


def json_kind(value):
    """The JSON name of a value's kind."""
    kinds = {dict: "object", list: "array", str: "string", bool: "boolean", type(None): "null"}
    return kinds.get(type(value), "number")


def text_parts(text, cuts):
    """(piece, begins) of one document held whole: its line ends made "\\n"."""
    text = text.replace("\r\n", "\n").replace("\r", "\n")
    for index, piece in enumerate(pieces_of(text, cuts) if text else []):
        yield piece, index == 0
