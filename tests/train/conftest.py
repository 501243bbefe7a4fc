"""Fixtures of the training modules' tests."""

import pytest


@pytest.fixture
def corpus(tmp_path, monkeypatch):
    """A small text file to pretrain on, and a token cache of the test's own."""
    monkeypatch.setenv("TINYGPT_CACHE", str(tmp_path / "cache"))
    sentences = [
        f"The {animal} number {i} walked over the {place} and sat down quietly. "
        for i in range(120)
        for animal, place in [("cat", "hill"), ("dog", "bridge")]
    ]
    path = tmp_path / "corpus.txt"
    path.write_text("".join(sentences), encoding="utf-8")
    return path
