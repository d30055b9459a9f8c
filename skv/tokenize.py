"""Pluggable tokenization: token counts (and ids) for prompt segments.

The cache works in tokens, so every segment needs a token count. Two implementations:

``SimpleTokenizer`` (default) needs no files, network or third-party packages, and is fast and
deterministic. It cuts text with one regex into pieces shaped like a GPT-style BPE's pre-tokens,
then gives each piece a stable id (blake2b of the piece, modulo ``vocab_size``):

=================  =====================================================================
piece              rule
=================  =====================================================================
word               optional leading space + up to 6 letters (longer words -> several)
CJK / kana         one character per piece (BPEs give ~1 token per CJK character)
number             optional leading space + up to 3 digits (cl100k-style digit groups)
punctuation        optional leading space + up to 3 symbol characters (``_`` included)
whitespace         a run of whitespace; the last space before a word joins the word
other              any single character the above miss
=================  =====================================================================

On English prose this gives roughly one token per 4-5 characters, close to GPT-2 / cl100k /
Llama-3 BPEs (about 4 characters per token); code and JSON come out somewhat denser, which is
also what real BPEs do. It is an approximation for simulation, not an engine's exact count.

``HFTokenizer`` wraps a HuggingFace ``tokenizers`` JSON file from a *local* path, for exact
alignment with an engine serving that model. Segments are encoded one by one, so counts can
differ from the engine's by a token or so at each segment boundary (BPE merges across the
boundary, chat-template tokens), which a block-level simulation tolerates.
"""

from __future__ import annotations

import hashlib
import logging
import os
import re
from functools import lru_cache
from pathlib import Path
from typing import Protocol, runtime_checkable

logger = logging.getLogger(__name__)

DEFAULT_VOCAB_SIZE = 50_000

_CJK = "\u3040-\u30ff\u3400-\u4dbf\u4e00-\u9fff\uac00-\ud7af\uf900-\ufaff"

#: Alternatives are tried in order at each position; together they match every character,
#: so the pieces of a text always join back into the text.
_PIECE_RE = re.compile(
    rf"[{_CJK}]"  # CJK / kana / hangul: one char per token
    rf"| ?(?:(?![{_CJK}])[^\W\d_]){{1,6}}"  # letters, long words cut every 6
    r"| ?\d{1,3}"  # digit groups
    r"| ?(?:[^\s\w]|_){1,3}"  # punctuation and symbols
    r"|\s+(?!\S)"  # whitespace run, leaving its last space to the next word
    r"|\s+"  # trailing whitespace run
    r"|.",  # anything else (e.g. unusual combining marks)
    re.DOTALL,
)


@runtime_checkable
class Tokenizer(Protocol):
    """What the segmenter needs from a tokenizer: ids and (cheaply) their count."""

    def encode(self, text: str) -> list[int]: ...

    def count(self, text: str) -> int: ...


@lru_cache(maxsize=1 << 16)
def _piece_id(piece: str, vocab_size: int) -> int:
    digest = hashlib.blake2b(piece.encode("utf-8"), digest_size=8).digest()
    return int.from_bytes(digest, "little") % vocab_size


class SimpleTokenizer:
    """Regex pre-tokenizer + hashed ids: a BPE-like count with no files or network."""

    name = "simple"

    def __init__(self, vocab_size: int = DEFAULT_VOCAB_SIZE) -> None:
        if vocab_size < 1:
            raise ValueError(f"vocab_size must be >= 1, got {vocab_size}")
        self.vocab_size = vocab_size

    def pieces(self, text: str) -> list[str]:
        """The text cut into token pieces; ``"".join(pieces(t)) == t`` always."""
        return _PIECE_RE.findall(text)

    def encode(self, text: str) -> list[int]:
        vs = self.vocab_size
        return [_piece_id(p, vs) for p in _PIECE_RE.findall(text)]

    def count(self, text: str) -> int:
        return len(_PIECE_RE.findall(text))

    def __repr__(self) -> str:
        return f"SimpleTokenizer(vocab_size={self.vocab_size})"


class HFTokenizer:
    """A HuggingFace ``tokenizer.json`` loaded from a local file (never from the hub).

    ``path`` may be the JSON file or a model directory containing ``tokenizer.json``.
    Special tokens (BOS etc.) are not added: segments are pieces of a prompt, not whole prompts.
    """

    def __init__(self, path: str | os.PathLike[str], *, add_special_tokens: bool = False) -> None:
        p = Path(path).expanduser()
        if p.is_dir():
            p = p / "tokenizer.json"
        if not p.is_file():
            raise FileNotFoundError(
                f"tokenizer file not found: {p} (expected a local HuggingFace tokenizer.json "
                "or a model directory containing one; skv never downloads tokenizers)"
            )
        try:
            from tokenizers import Tokenizer as _HFTok
        except ImportError as exc:
            raise ImportError(
                "HFTokenizer needs the `tokenizers` package: pip install 'skv[tokenizers]' "
                "(or use the default SimpleTokenizer)"
            ) from exc
        try:
            self._tok = _HFTok.from_file(str(p))
        except Exception as exc:  # tokenizers raises a bare Exception on bad JSON
            raise ValueError(f"cannot load tokenizer from {p}: {exc}") from exc
        self.path = p
        self.add_special_tokens = add_special_tokens
        self.name = f"hf:{p}"
        logger.debug("loaded HuggingFace tokenizer from %s", p)

    def encode(self, text: str) -> list[int]:
        return list(self._tok.encode(text, add_special_tokens=self.add_special_tokens).ids)

    def count(self, text: str) -> int:
        return len(self._tok.encode(text, add_special_tokens=self.add_special_tokens).ids)

    def __repr__(self) -> str:
        return f"HFTokenizer({str(self.path)!r})"


_DEFAULT = SimpleTokenizer()


@lru_cache(maxsize=8)
def _load_hf(path: str) -> HFTokenizer:
    return HFTokenizer(path)


def get_tokenizer(spec: str | os.PathLike[str] | Tokenizer | None = None) -> Tokenizer:
    """Resolve a tokenizer spec: None / ``"simple"`` -> SimpleTokenizer, else a local path.

    A ready tokenizer object is passed through, so callers can accept either form. Loaded files
    are cached by resolved path, since trace builders call this per request.
    """
    if spec is None or (isinstance(spec, str) and spec.strip().lower() == "simple"):
        return _DEFAULT
    if isinstance(spec, str | os.PathLike):
        return _load_hf(str(Path(spec).expanduser().resolve()))
    if isinstance(spec, Tokenizer):
        return spec
    raise TypeError(f"tokenizer spec must be None, 'simple', a path or a Tokenizer; got {spec!r}")
