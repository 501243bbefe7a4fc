"""Text preparation for GPT-1's tokenizer, as in the original code, without ftfy or spaCy.

The original encoder ran every text through three steps before BPE:

1. `ftfy.fix_text` repaired broken unicode. `fix_text` here does what its default settings do to
   ordinary text: HTML entities, common mojibake, ligatures, full-width forms, curly quotes, line
   breaks, control characters, NFC.
2. `text_standardize` (its own function, rewritten here) unified dashes and put spaces around
   punctuation runs.
3. spaCy's English tokenizer (`spacy.load('en')`) cut the text into words. `EnglishWordSplitter`
   follows the same rules: split on spaces, peel prefixes and suffixes off each chunk, cut it at
   infixes, and keep the tokenizer exceptions (contractions, abbreviations) as spaCy writes them.

`GPT1Normalizer` runs the three steps and lower-cases the words, for a byte-level BPE of one's own.
"""

import html.entities
import re
import unicodedata
from itertools import accumulate, chain, compress, count

import regex

# ----------------------------------------------------------------------------------------------
# 1. Fixing broken unicode: the parts of ftfy.fix_text (version 6, default settings) that matter
#    for ordinary text.


# {character: byte} for Latin-1 and for Windows-1252, whose five unused bytes stand for themselves
# (ftfy's "sloppy-windows-1252").
_CP1252_BYTES = {chr(byte): byte for byte in range(0x80, 0x100)} | {
    bytes([byte]).decode("cp1252"): byte
    for byte in range(0x80, 0xA0)
    if byte not in (0x81, 0x8D, 0x8F, 0x90, 0x9D)
}
_TAIL = "".join(char for char, byte in _CP1252_BYTES.items() if byte < 0xC0)  # UTF-8 bytes 80..BF
_MAC_TAIL = bytes(range(0x80, 0xC0)).decode("mac_roman")
# Telltale mojibake: UTF-8 for Latin-1, Latin Extended-A, Greek and Cyrillic letters and for
# punctuation and symbols (U+2000..), read as Windows-1252 ("é" -> "Ã©", "’" -> "â€™") or as Mac Roman
# ("é" -> "√©", "’" -> "‚Äô"). Other sequences ("ß“", "l’é") also occur in ordinary text.
_CP1252_TELLTALE = re.compile(f"[ÂÃÄÅÎÏÐÑ][{_TAIL}]|â[{_TAIL}]{{2}}")
_MAC_ROMAN_TELLTALE = re.compile(f"[¬√ƒ≈][{_MAC_TAIL}]|‚[ÄÑ][{_MAC_TAIL}]")


def _read_again(text, encode):
    """The text encoded back to the bytes it was read from and decoded as UTF-8; None if that fails."""
    try:
        return encode(text).decode("utf-8")
    except (UnicodeError, ValueError):  # ValueError: a character beyond one byte
        return None


def _cp1252_bytes(text):
    return bytes(_CP1252_BYTES.get(char, ord(char)) for char in text)


def _mac_roman_bytes(text):
    return text.encode("mac_roman")


def _fix_mojibake(text):
    """Decode UTF-8 that was read as a single-byte encoding, as ftfy does: where the text shows
    telltale sequences, the whole line read again as UTF-8 if it can be (from Windows-1252 or
    Latin-1, else from Mac Roman), or else each telltale sequence on its own."""
    cp1252_telltale = _CP1252_TELLTALE.search(text)
    if cp1252_telltale and (fixed := _read_again(text, _cp1252_bytes)) is not None:
        return fixed
    if _MAC_ROMAN_TELLTALE.search(text) and (fixed := _read_again(text, _mac_roman_bytes)) is not None:
        return fixed
    if cp1252_telltale:  # each telltale sequence is valid UTF-8 on its own
        return _CP1252_TELLTALE.sub(lambda match: _read_again(match.group(), _cp1252_bytes), text)
    return text


def _html_entities():
    """{'&name;': text} for HTML5's entities that end in ';', plus upper-case spellings of the
    lower-case ones that mean nothing else ('&EACUTE;' -> 'É'), as ftfy decodes them."""
    entities = {}
    for name, char in html.entities.html5.items():
        if name.endswith(";"):
            entities["&" + name] = char
            upper = "&" + name.upper()
            if name == name.lower() and html.unescape(upper) == upper:
                entities[upper] = char.upper()
    return entities


_HTML_ENTITIES = _html_entities()
_HTML_ENTITY = re.compile(r"&#?[0-9A-Za-z]{1,24};")


def _unescape_entity(match):
    entity = match.group()
    if entity in _HTML_ENTITIES:
        return _HTML_ENTITIES[entity]
    if entity.startswith("&#"):
        char = html.unescape(entity)
        return entity if ";" in char else char  # a number html.unescape could not decode
    return entity


def _character_fixes():
    """One translate table: Latin ligatures apart, full-width forms to normal width, curly
    quotes straight, every line break to '\\n', and unintended control characters removed."""
    table = dict.fromkeys("\u02bc\u2018\u2019\u201a\u201b", "'")
    table |= dict.fromkeys("\u201c\u201d\u201e\u201f", '"')
    table |= {"\u3000": " ", "\u2028": "\n", "\u2029": "\n", "\r": "\n"}
    table |= {chr(code): unicodedata.normalize("NFKC", chr(code)) for code in range(0xFF01, 0xFFF0)}
    ligatures = (
        "Ĳ IJ ĳ ij ŉ ʼn Ǳ DZ ǲ Dz ǳ dz Ǆ DŽ ǅ Dž ǆ dž Ǉ LJ ǈ Lj ǉ lj Ǌ NJ ǋ Nj ǌ nj "
        "ﬀ ff ﬁ fi ﬂ fl ﬃ ffi ﬄ ffl ﬅ ſt ﬆ st"
    )
    table |= dict(zip(ligatures.split()[::2], ligatures.split()[1::2]))
    controls = [
        *range(0x00, 0x09),
        0x0B,
        *range(0x0E, 0x20),
        0x7F,
        *range(0x206A, 0x2070),
        0xFEFF,
        *range(0xFFF9, 0xFFFD),
    ]
    return str.maketrans(table | {chr(code): None for code in controls})


_CHARACTER_FIXES = _character_fixes()
_C1_CONTROL = re.compile("[\x80-\x9f]")
_TERMINAL_ESCAPE = re.compile(r"\x1b\[[\d;]*[a-zA-Z]")
_SURROGATE = re.compile("[\ud800-\udfff]")
_ASCII_TO_FIX = re.compile(r"[&\x00-\x08\x0b\x0d-\x1f\x7f]")  # what a fix may change in ASCII


def mend_surrogates(text):
    """Text that UTF-8 can spell: each UTF-16 surrogate pair made its character, a lone half U+FFFD."""
    if text.isascii() or not _SURROGATE.search(text):
        return text
    return text.encode("utf-16", "surrogatepass").decode("utf-16", "replace")


def _fix_c1_control(match):
    """A C1 control character is almost always a Windows-1252 character read as Latin-1."""
    return match.group().encode("latin-1").decode("cp1252", "ignore") or match.group()


def _fix_segment(text, unescape_html):
    """Apply every fix until none changes anything, as ftfy does for one line."""
    while True:
        before = text
        if unescape_html:
            text = _HTML_ENTITY.sub(_unescape_entity, text)
        text = _fix_mojibake(text)
        text = _C1_CONTROL.sub(_fix_c1_control, text)
        text = _TERMINAL_ESCAPE.sub("", text)
        text = text.replace("\r\n", "\n").translate(_CHARACTER_FIXES)
        text = mend_surrogates(text)
        text = unicodedata.normalize("NFC", text)
        if text == before:
            return text


def fix_text(text):
    """Repair broken unicode line by line, like `ftfy.fix_text(text)` with its defaults.

    HTML entities are decoded only until a line containing '<' is met (ftfy's 'auto': such
    text may be real HTML); from that line on they are kept.
    """
    fixed, unescape_html = [], True
    for line in re.findall(r"[^\n]*\n|[^\n]+", text):
        unescape_html = unescape_html and "<" not in line
        if line.isascii() and not _ASCII_TO_FIX.search(line):
            fixed.append(line)  # what no fix changes: most lines of English
        else:
            fixed.append(_fix_segment(line, unescape_html))
    return "".join(fixed)


# ----------------------------------------------------------------------------------------------
# 2. The original text_standardize.

_DASHES_AND_ELLIPSIS = {"—": "-", "–": "-", "―": "-", "…": "...", "´": "'"}
# A run of one of these characters gets a space on each side. (The original pattern also meant to
# list the backslash, but its escaping turned that entry into a second '+', so '\' stays as it is.)
_SPACED_PUNCTUATION = re.compile(r'([-~!";?+,)(/*\[\]}{|_])\1*')
_NEWLINE = re.compile(r"\s*\n\s*")
_OTHER_WHITESPACE = re.compile(r"[^\S\n]{2,}|[^\S\n ]")  # what is not one ' ' already


def text_standardize(text):
    """The original GPT-1 clean-up: unify dashes, spell out the ellipsis, make the acute accent
    an apostrophe, set punctuation runs apart, and keep each line break as ' \\n '."""
    for char, replacement in _DASHES_AND_ELLIPSIS.items():
        text = text.replace(char, replacement)
    text = _SPACED_PUNCTUATION.sub(r" \g<0> ", text)
    text = _NEWLINE.sub(" \n ", text)
    text = _OTHER_WHITESPACE.sub(" ", text)
    return text.strip()


# ----------------------------------------------------------------------------------------------
# 3. spaCy's English tokenizer rules (spaCy 3), as character classes, regexes and exceptions.


def _class(chars):
    """Characters escaped for use inside a regex character class."""
    return "".join(regex.escape(char, special_only=False) for char in chars)


# Letters as spaCy counts them: Latin ones, the Greek and Cyrillic letters of the languages it
# covers, and scripts without case, which count as lower and upper case alike.
_UNCASED = (
    r"\u1200-\u137F\u0980-\u09FF\u0591-\u05F4\uFB1D-\uFB4F"  # Ethiopic, Bengali, Hebrew
    r"\u0620-\u064A\u066E-\u06D5\u06E5-\u06FF\u0750-\u077F\u08A0-\u08BD\uFB50-\uFBB1"  # Arabic
    r"\uFBD3-\uFD3D\uFD50-\uFDC7\uFDF0-\uFDFB\uFE70-\uFEFC\U0001EE00-\U0001EEBB"
    r"\u0D80-\u0DFF\u0900-\u097F\u0C80-\u0CFF\u0B80-\u0BFF\u0C00-\u0C7F"  # Sinhala, Hindi, Kannada, ...
    r"\uAC00-\uD7AF\u1100-\u11FF\u3040-\u30FF"  # Hangul, kana
    r"\u2E80-\u2FDF\u2FF0-\u303F\u31C0-\u31EF\u3200-\u4DBF\u4E00-\u9FFF\uF900-\uFAFF\uFE30-\uFE4F"  # CJK
    r"\U0001F200-\U0001F2FF\U00020000-\U0002EBEF\U0002F800-\U0002FA1F"
)
_LOWER = rf"[\p{{Ll}}&&\p{{Latin}}]α-ωάέίόώήύа-яёіїєґәөүҗңһѓѕјљњќѐѝ{_UNCASED}"
_UPPER = rf"[\p{{Lu}}&&\p{{Latin}}]Α-ΩΆΈΊΌΏΉΎА-ЯЁІЇЄҐӘӨҮҖҢҺЃЅЈЉЊЌЀЍ{_UNCASED}"
_ALPHA = rf"{_LOWER}{_UPPER}[\p{{Lt}}&&\p{{Latin}}]"
_QUOTES = _class("'\"”“`‘´’‚,„»«「」『』（）〔〕【】《》〈〉〈〉⟦⟧")
_PUNCT = _class("…,:;!?¿؟¡()[]{}<>_#*&。？！，、；：～·।،۔؛٪")
_CURRENCY = r"US\$|C\$|A\$|[" + _class("$£€¥฿₽﷼₴₠₡₢₣₤₥₦₧₨₩₪₫₭₮₯₰₱₲₳₵₶₷₸₹₺₻₼₾₿") + "]"
_UNITS = "|".join(
    regex.escape(unit)
    for unit in (
        "km km² km³ m m² m³ dm dm² dm³ cm cm² cm³ mm mm² mm³ ha µm nm yd in ft kg g mg µg t lb oz m/s "
        "km/h kmh mph hPa Pa mbar mb MB kb KB gb GB tb TB T G M K % км км² км³ м м² м³ дм дм² дм³ см "
        "см² см³ мм мм² мм³ нм кг г мг м/с км/ч кПа Па мбар Кб КБ кб Мб МБ мб Гб ГБ гб Тб ТБ"
    ).split()
)
_SYMBOL = r"\p{So}"  # spaCy's "icons": dingbats, emoji, °, ©, ...


def _compile(pattern):
    return regex.compile(pattern, flags=regex.V1)  # V1: set operations such as [\p{Ll}&&\p{Latin}]


# A prefix is matched at the start of a chunk (the first alternative that fits wins) ...
_PREFIX = _compile(rf"\.\.+|{_CURRENCY}|\+(?![0-9])|[§%=—–{_PUNCT}{_QUOTES}]|{_SYMBOL}")
# ... a suffix at its end (the match that starts leftmost wins) ...
_SUFFIX = _compile(
    rf"(?:\.\.+|……|[{_PUNCT}{_QUOTES}—–]|{_SYMBOL}|['’][sS]"
    rf"|(?<=[0-9])(?:\+|{_CURRENCY}|{_UNITS})"
    rf"|(?<=°[FfCcKk])\."
    rf"|(?<=[0-9{_LOWER}%²\-+|{_PUNCT}{_QUOTES}])\."  # a full stop after a lower-case letter, digit, ...
    rf"|(?<=[{_UPPER}][{_UPPER}])\.)$"  # ... or after two capitals ("USA."), but not "U.S."
)
# ... and an infix splits what is left, wherever it occurs.
_INFIX = _compile(
    rf"\.\.+|…|{_SYMBOL}"
    rf"|(?<=[0-9])[+\-*^](?=[0-9-])"
    rf"|(?<=[{_LOWER}{_QUOTES}])\.(?=[{_UPPER}{_QUOTES}])"
    rf"|(?<=[{_ALPHA}]),(?=[{_ALPHA}])"
    rf"|(?<=[{_ALPHA}0-9])(?:-|–|—|--|---|——|~)(?=[{_ALPHA}])"
    rf"|(?<=[{_ALPHA}0-9])[:<>=/](?=[{_ALPHA}])"
)
_HOST_CHAR = r"A-Za-z0-9\u00a1-\uffff"
# What is left is kept whole when it looks like a URL or a domain name ("www.example.com").
_URL = _compile(
    rf"(?:[\w+\-.]{{2,}}://)?(?:\S+(?::\S*)?@)?"
    rf"(?:(?:[{_HOST_CHAR}][{_HOST_CHAR}_\-]{{0,62}})?[{_HOST_CHAR}]\.)+[{_LOWER}]{{2,63}}"
    rf"(?::\d{{2,5}})?(?:[/?#]\S*)?"
)

# Contractions: each word joined with each ending; the spaces in an ending mark where it splits.
_WILL = ("'ll", "ll", "'ll 've", "ll ve", "'d", "d", "'d 've", "d ve")
_HAVE, _ARE, _IS = ("'ve", "ve"), ("'re", "re"), ("'s", "s")
_NOT = ("n't", "nt", "n't 've", "nt ve")
_CONTRACTIONS = [
    ("i", ("'m", "m", "'m a", "m a") + _WILL + _HAVE),
    ("you we they", _WILL + _HAVE + _ARE),
    ("he she it", _WILL + _IS),
    ("who what when where why how there", _IS + _WILL + _ARE + _HAVE),
    ("that this", _IS + _WILL),
    ("these those", _WILL + _ARE + _HAVE),
    ("ca do does did had may need ought sha wo", _NOT),
    ("could might must should would", _NOT + _HAVE),
    ("ai are is was were have has dare", _NOT[:2]),
    ("how", ("'d 'y",)),
    ("not", _HAVE),
    ("can", ("not",)),
    ("gon", ("na",)),
    ("got", ("ta",)),
    ("let", ("'s",)),
    ("c'm", ("on",)),
]
_NOT_CONTRACTIONS = "Ill ill Its its Hell hell Shell shell Shed shed were Were Well well Whore whore"
_WHOLE_WORDS = (  # kept as one token, apostrophes and full stops included
    "'s 'S ‘s ‘S 're 'd 'cause 'Cause 'cos 'Cos 'coz 'Coz 'cuz 'Cuz 'bout 'em 'll 'nuff em ll nuff "
    "ma'am Ma'am o'clock O'clock and/or w/o ' '' C++ \\\") <space> \\t \\n \u2014 "
    "a.m. p.m. e.g. E.g. E.G. i.e. I.e. I.E. Ph.D. vs. v.s. co. Co. Corp. Inc. Ltd. Bros. D.C. "
    "Mr. Mrs. Ms. Messrs. Dr. Prof. Rev. Gen. Gov. Sen. Rep. Adm. Jr. St. Mt. Md. Mo. Mont. "
    "Jan. Feb. Mar. Apr. Jun. Jul. Aug. Sep. Sept. Oct. Nov. Dec. "
    "Ak. Ala. Ariz. Ark. Calif. Colo. Conn. Del. Fla. Ga. Ia. Id. Ill. Ind. Kan. Kans. Ky. La. "
    "Mass. Mich. Minn. Miss. N.C. N.D. N.H. N.J. N.M. N.Y. Neb. Nebr. Nev. Okla. Ore. Pa. S.C. "
    "Tenn. Va. Wash. Wis. ä. ö. ü. " + " ".join(f"{letter}." for letter in "abcdefghijklmnopqrstuvwxyz")
)
_EMOTICONS = (
    ":) :-) :)) :-)) :))) :-))) (: (-: =) (= :] :-] [: [-: [= =] :o) (o: :} :-} 8) 8-) (-8 ;) ;-) "
    "(; (-; :( :-( :(( :-(( :((( :-((( ): )-: =( >:( :') :'-) :'( :'-( :/ :-/ =/ =| :| :-| ]= =[ "
    ":1 :P :-P :p :-p :O :-O :o :-o :0 :-0 :() >:o :* :-* :3 :-3 =3 :> :-> :X :-X :x :-x :D :-D "
    ";D ;-D =D xD XD xDD XDD 8D 8-D ^_^ ^__^ ^___^ >.< >.> <.< ._. ;_; -_- -__- v.v V.V v_v V_V "
    "o_o o_O O_o O_O 0_o o_0 0_0 o.O O.o O.O o.o 0.0 o.0 0.o @_@ <3 <33 <333 </3 (^_^) (-_-) (._.) "
    "(>_<) (*_*) (¬_¬) ಠ_ಠ ಠ︵ಠ (ಠ_ಠ) ¯\\(ツ)/¯ (╯°□°）╯︵┻━┻ ><(((*>"
)


def _special_cases():
    """spaCy's English tokenizer exceptions: {chunk: the tokens it becomes}."""
    cases = {}
    for words, endings in _CONTRACTIONS:
        for word in words.split():
            for first in (word, word.capitalize()):
                for ending in endings:
                    pieces = (first, *ending.split())
                    cases["".join(pieces)] = pieces
    for word in _NOT_CONTRACTIONS.split():
        del cases[word]
    cases.update({"y'all": ("y'", "all"), "yall": ("y", "all"), "How'd'y": ("How", "'d", "'y")})
    for word in "doin goin nothin nuthin ol somethin lovin havin".split():  # dropped final g
        for spelling in (word, word + "'", word.capitalize(), word.capitalize() + "'"):
            cases[spelling] = (spelling,)
    for hour in range(1, 13):
        for period in ("a.m.", "am", "p.m.", "pm"):
            cases[f"{hour}{period}"] = (str(hour), period)
    for unit in "cfkCFK":
        cases[f"°{unit}."] = ("°", unit, ".")
    for whole in (_WHOLE_WORDS + " " + _EMOTICONS).split() + [" ", "\t", "\n", "\u00a0"]:
        cases[whole] = (whole,)
    for case, pieces in list(cases.items()):  # each again with the typographic apostrophe
        if "'" in case:
            cases[case.replace("'", "’")] = tuple(piece.replace("'", "’") for piece in pieces)
    return cases


# A run of non-space characters; or the whitespace after a word but its first ' '; or at the start.
_CHUNK = re.compile(r"\S+|(?<=\S )\s+|(?<=\S)[^\S ]\s*|^\s+")


class EnglishWordSplitter:
    """Splits text into words like spaCy's English tokenizer (`spacy.blank("en")`).

    `splitter(text)` returns the token texts. The text is cut into chunks, runs of non-space and
    of space characters: one ' ' after a word only ends the word, any other whitespace ('\\n ', a
    second space) becomes a chunk of its own. Each chunk is tokenized once and remembered.
    """

    def __init__(self):
        self._special_cases = _special_cases()
        # spaCy's second pass: tokens that, side by side, spell a special case the rules split
        # ("hello''" -> "hello", "'", "'") are put back together ("''").
        self._rejoin = {}
        for case, pieces in self._special_cases.items():
            split = tuple(self._split_chunk(case, use_special_cases=False))
            if len(split) > 1:
                self._rejoin[split] = pieces
        self._rejoin_pairs = {split[:2] for split in self._rejoin}  # to rule most texts out fast
        self._longest_rejoin = max(map(len, self._rejoin))
        self._cache = {}

    def __call__(self, text):
        chunks = _CHUNK.findall(text)
        if len(self._cache) > 100_000:
            self._cache.clear()
        for chunk in set(chunks).difference(self._cache):
            self._cache[chunk] = self._split_chunk(chunk)
        pieces = list(map(self._cache.__getitem__, chunks))
        tokens = list(chain.from_iterable(pieces))
        if self._rejoin_pairs.isdisjoint(zip(tokens, tokens[1:])):
            return tokens
        return self._rejoin_special_cases(tokens, set(accumulate(map(len, pieces), initial=0)))

    def _split_chunk(self, chunk, use_special_cases=True):
        special = self._special_cases if use_special_cases else {}
        if chunk in special:
            return list(special[chunk])
        if chunk.isalpha():  # no affix or infix rule matches letters alone: most words end here
            return [chunk]
        prefixes, suffixes = [], []
        while chunk and chunk not in special:
            prefix = _PREFIX.match(chunk)
            prefix_len = prefix.end() if prefix else 0
            if prefix_len and chunk[prefix_len:] in special:
                prefixes.append(chunk[:prefix_len])
                chunk = chunk[prefix_len:]
                break
            suffix = _SUFFIX.search(chunk[prefix_len:])
            suffix_len = len(suffix.group()) if suffix else 0
            if suffix_len and chunk[:-suffix_len] in special:
                suffixes.append(chunk[-suffix_len:])
                chunk = chunk[:-suffix_len]
                break
            if not prefix_len and not suffix_len:
                break
            if prefix_len:
                prefixes.append(chunk[:prefix_len])
            if suffix_len:
                suffixes.append(chunk[-suffix_len:])
            chunk = chunk[prefix_len : len(chunk) - suffix_len]
        return prefixes + self._split_infixes(chunk, special) + suffixes[::-1]

    @staticmethod
    def _split_infixes(chunk, special):
        """What is left after the affixes: a special case, a URL, or pieces cut at infixes."""
        if not chunk:
            return []
        if chunk in special:
            return list(special[chunk])
        if _URL.fullmatch(chunk):
            return [chunk]
        tokens, start = [], 0
        for infix in _INFIX.finditer(chunk):
            if infix.start() == 0:  # spaCy never cuts at the very first character
                continue
            if infix.start() > start:
                tokens.append(chunk[start : infix.start()])
            tokens.append(infix.group())
            start = infix.end()
        if chunk[start:]:
            tokens.append(chunk[start:])
        return tokens

    def _rejoin_special_cases(self, tokens, chunk_starts):
        """Replace runs of tokens that spell a split special case, longest then leftmost first.
        A run across a space is not replaced, but still stands in the way of the runs it overlaps."""
        may_start = map(self._rejoin_pairs.__contains__, zip(tokens, tokens[1:]))
        runs = [
            (start, end)
            for start in compress(count(), may_start)
            for end in range(start + 2, min(len(tokens), start + self._longest_rejoin) + 1)
            if tuple(tokens[start:end]) in self._rejoin
        ]
        chosen, covered = {}, set()
        for start, end in sorted(runs, key=lambda run: (run[0] - run[1], run[0])):
            if start not in covered and end - 1 not in covered:
                chosen[start] = end
            covered.update(range(start, end))
        rejoined, position = [], 0
        for start, end in sorted(chosen.items()):
            if chunk_starts.isdisjoint(range(start + 1, end)):
                rejoined += tokens[position:start]
                rejoined += self._rejoin[tuple(tokens[start:end])]
                position = end
        return rejoined + tokens[position:]


# ----------------------------------------------------------------------------------------------
# 4. The three steps and lower case, as a normalizer for a BPE of one's own.


class GPT1Normalizer:
    """Text as GPT-1's encoder saw it, one string: unicode fixed, `text_standardize`, words split
    like spaCy, lower case, the words joined by single spaces ("It's fine." -> "it 's fine .").
    A byte-level BPE trained on such text sees books and GLUE's lower-cased, tokenized sentences
    alike."""

    name = "gpt1"

    def __init__(self):
        self._split_words = EnglishWordSplitter()

    def __call__(self, text):
        return " ".join(word.lower() for word in self._split_words(text_standardize(fix_text(text))))
