"""bench/mutations.py's catalogue stays in step with the CUDA sources and the kernel tests: a mutation
whose text an edit of its source has changed would no longer measure anything."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parents[1] / "bench"))
import mutations  # noqa: E402


def test_every_mutation_matches_its_source_exactly_once_and_every_source_has_some():
    assert mutations.catalogue_problems() == []
    sources = {path.name for path in (mutations.ROOT / mutations.CUDA).iterdir()}
    assert {m.source for m in mutations.MUTATIONS} == sources == set(mutations.KERNEL_TESTS)
    run = set(mutations.EVERY_TEST)  # what a mutation runs: each source's own files, every kernel test
    assert {name for names in mutations.KERNEL_TESTS.values() for name in names} <= run
    assert {path.name for path in (mutations.ROOT / mutations.TESTS).glob("test_kernels*.py")} <= run
