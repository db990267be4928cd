"""Fixtures shared by the ELECTRA integration tests."""
import numpy as np
import pytest


@pytest.fixture(scope="module")
def corpus(tmp_path_factory) -> dict:
    """A generated English-like corpus file and a shared cache, so tokenizer/examples are built once."""
    root = tmp_path_factory.mktemp("corpus")
    rng = np.random.default_rng(0)
    words = ["the", "a", "cat", "dog", "sat", "on", "mat", "ran", "to", "house", "big", "small", "red", "blue",
             "quickly", "slowly", "and", "but", "then", "saw", "bird", "tree", "under", "over", "green", "old"]
    lines = [" ".join(rng.choice(words, size=rng.integers(5, 15))) + "." for _ in range(1500)]
    path = root / "corpus.txt"
    path.write_text("\n".join(lines) + "\n")
    return {"file": str(path), "cache": str(root / "cache"), "root": root}
