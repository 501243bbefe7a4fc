"""Applying learned BPE merges to one word, shared by both tokenizers."""

_NEVER = float("inf")


def apply_merges(symbols, ranks):
    """Merge adjacent symbols of a word, lowest-ranked pair first, until no known pair is left.

    symbols: a tuple of strings (characters, or byte characters) making up one word.
    ranks: {(left, right): rank}, rank 0 merged first.
    Returns the tuple of merged pieces.
    """
    symbols = list(symbols)
    while len(symbols) > 1:
        pair = min(zip(symbols, symbols[1:]), key=lambda p: ranks.get(p, _NEVER))
        if pair not in ranks:
            break
        symbols = replace_pair(symbols, *pair, pair[0] + pair[1])
    return tuple(symbols)


def replace_pair(symbols, left, right, merged):
    """Replace each adjacent (left, right) in the list `symbols`, left to right, by `merged`."""
    out, i, last = [], 0, len(symbols) - 1
    while i <= last:
        if i < last and symbols[i] == left and symbols[i + 1] == right:
            out.append(merged)
            i += 2
        else:
            out.append(symbols[i])
            i += 1
    return out
