"""Tokenizers: the dependency-free default and local HuggingFace tokenizer.json files."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from skv.tokenize import (
    DEFAULT_VOCAB_SIZE,
    HFTokenizer,
    SimpleTokenizer,
    Tokenizer,
    get_tokenizer,
)

PROSE = (
    "Prefix caching avoids recomputing shared prompt prefixes during the prefill phase of "
    "inference. Under constrained cache memory, the eviction policy decides whether reusable "
    "blocks stay resident or are displaced by one-off prompt text. Least recently used works "
    "well when recent reuse predicts future reuse, while frequency-based policies do well when "
    "a few exact blocks dominate. The quick brown fox jumps over the lazy dog, then runs into "
    "the forest to find its friends before the sun goes down."
)

SENTENCES = [
    "the cache keeps reusable blocks resident",
    "a system prompt is shared by many requests",
    "retrieved documents repeat across users",
    "the eviction policy decides what to drop",
    "tool outputs and code snippets are reused",
] * 4


@pytest.fixture(scope="module")
def tokenizer_json(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny BPE trained locally (no hub access) and saved as tokenizer.json."""
    from tokenizers import Tokenizer as HFTok
    from tokenizers import models, pre_tokenizers, trainers

    tok = HFTok(models.BPE(unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.train_from_iterator(
        SENTENCES, trainers.BpeTrainer(vocab_size=120, special_tokens=["[UNK]"])
    )
    path = tmp_path_factory.mktemp("tok") / "tokenizer.json"
    tok.save(str(path))
    return path


def test_simple_tokenizer_is_deterministic_across_instances() -> None:
    assert SimpleTokenizer().encode(PROSE) == SimpleTokenizer().encode(PROSE)


def test_simple_tokenizer_pieces_are_pinned_for_a_fixed_sentence() -> None:
    # guards against silent changes to the regex, which would shift every trace's token counts
    assert SimpleTokenizer().pieces("The quick brown fox, 12345 times!") == [
        "The",
        " quick",
        " brown",
        " fox",
        ",",
        " 123",
        "45",
        " times",
        "!",
    ]


def test_simple_tokenizer_ids_are_pinned() -> None:
    # blake2b-derived ids must not depend on the process, machine or Python hash seed
    assert SimpleTokenizer().encode("hello world") == [25191, 32949]


def test_simple_tokenizer_leading_space_changes_the_id() -> None:
    assert SimpleTokenizer().encode("hello") != SimpleTokenizer().encode(" hello")


def test_simple_tokenizer_count_equals_encode_length() -> None:
    tok = SimpleTokenizer()
    assert tok.count(PROSE) == len(tok.encode(PROSE))


def test_simple_tokenizer_ids_fall_inside_vocab() -> None:
    ids = SimpleTokenizer(vocab_size=97).encode(PROSE)
    assert ids and all(0 <= i < 97 for i in ids)
    assert all(0 <= i < DEFAULT_VOCAB_SIZE for i in SimpleTokenizer().encode(PROSE))


def test_simple_tokenizer_rejects_empty_vocab() -> None:
    with pytest.raises(ValueError, match="vocab_size"):
        SimpleTokenizer(vocab_size=0)


def test_simple_tokenizer_gives_about_four_chars_per_token_on_english_prose() -> None:
    chars_per_token = len(PROSE) / SimpleTokenizer().count(PROSE)
    assert 3.5 <= chars_per_token <= 5.5


def test_simple_tokenizer_splits_long_words_like_a_bpe() -> None:
    assert SimpleTokenizer().count("internationalization") >= 3


def test_simple_tokenizer_counts_cjk_per_character() -> None:
    assert SimpleTokenizer().count("日本語のテキスト") == 8


def test_simple_tokenizer_empty_text_has_no_tokens() -> None:
    assert SimpleTokenizer().count("") == 0
    assert SimpleTokenizer().encode("") == []


@given(st.text())
def test_simple_tokenizer_pieces_join_back_to_the_text(text: str) -> None:
    assert "".join(SimpleTokenizer().pieces(text)) == text


def test_simple_tokenizer_satisfies_protocol() -> None:
    assert isinstance(SimpleTokenizer(), Tokenizer)


def test_hf_tokenizer_counts_equal_tokenizers_library(tokenizer_json: Path) -> None:
    from tokenizers import Tokenizer as HFTok

    ref = HFTok.from_file(str(tokenizer_json))
    tok = HFTokenizer(tokenizer_json)
    for text in [*SENTENCES[:5], "the unseen words zebra quantum", ""]:
        expected = ref.encode(text, add_special_tokens=False).ids
        assert tok.encode(text) == expected
        assert tok.count(text) == len(expected)


def test_hf_tokenizer_accepts_a_model_directory(tokenizer_json: Path) -> None:
    assert HFTokenizer(tokenizer_json.parent).count("the cache") == HFTokenizer(
        tokenizer_json
    ).count("the cache")


def test_hf_tokenizer_missing_file_error_names_the_path(tmp_path: Path) -> None:
    missing = tmp_path / "nope" / "tokenizer.json"
    with pytest.raises(FileNotFoundError, match="tokenizer file not found") as err:
        HFTokenizer(missing)
    assert str(missing) in str(err.value)


def test_hf_tokenizer_corrupt_file_gives_value_error(tmp_path: Path) -> None:
    bad = tmp_path / "tokenizer.json"
    bad.write_text(json.dumps({"not": "a tokenizer"}))
    with pytest.raises(ValueError, match="cannot load tokenizer"):
        HFTokenizer(bad)


def test_hf_tokenizer_without_package_gives_install_hint(
    tokenizer_json: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(sys.modules, "tokenizers", None)
    with pytest.raises(ImportError, match=r"skv\[tokenizers\]"):
        HFTokenizer(tokenizer_json)


def test_get_tokenizer_defaults_to_simple() -> None:
    assert isinstance(get_tokenizer(None), SimpleTokenizer)
    assert isinstance(get_tokenizer("simple"), SimpleTokenizer)


def test_get_tokenizer_loads_a_path(tokenizer_json: Path) -> None:
    tok = get_tokenizer(str(tokenizer_json))
    assert isinstance(tok, HFTokenizer)
    assert get_tokenizer(tokenizer_json) is tok  # cached by resolved path


def test_get_tokenizer_passes_through_a_tokenizer_object() -> None:
    tok = SimpleTokenizer(vocab_size=10)
    assert get_tokenizer(tok) is tok


def test_get_tokenizer_missing_path_raises(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError):
        get_tokenizer(str(tmp_path / "missing.json"))


def test_get_tokenizer_rejects_other_types() -> None:
    with pytest.raises(TypeError, match="tokenizer spec"):
        get_tokenizer(42)  # type: ignore[arg-type]
