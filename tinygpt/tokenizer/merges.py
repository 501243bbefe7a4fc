"""Applying learned BPE merges to one word, shared by both tokenizers."""


def apply_merges(symbols, ranks):
    """Merge adjacent symbols of a word, lowest-ranked pair first, until no known pair is left.

    symbols: a tuple of strings (characters, or byte characters) making up one word.
    ranks: {(left, right): rank}, rank 0 merged first.
    Returns the tuple of merged pieces.
    """
    symbols = list(symbols)
    while len(symbols) > 1:
        best_rank, best_pair = None, None
        for pair in zip(symbols, symbols[1:]):
            rank = ranks.get(pair)
            if rank is not None and (best_rank is None or rank < best_rank):
                best_rank, best_pair = rank, pair
        if best_pair is None:
            break
        left, right = best_pair
        merged, i = [], 0
        while i < len(symbols):
            if i + 1 < len(symbols) and symbols[i] == left and symbols[i + 1] == right:
                merged.append(left + right)
                i += 2
            else:
                merged.append(symbols[i])
                i += 1
        symbols = merged
    return tuple(symbols)
