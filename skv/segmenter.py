"""Rule-based segmentation of OpenAI-style chat requests into typed prompt segments.

Policies value tokens by role, so a request must be cut into typed spans. The rules are plain
regexes, applied in a fixed order, so every label can be explained by pointing at one rule.

Message roles
-------------

==========================  ==========================================================
input                       segment type
==========================  ==========================================================
``tools`` (request field)   one TOOL_SCHEMA segment, *first* (engines render tool
                            definitions with or before the system prompt); JSON with
                            sorted keys, so equal tool sets hash equally
``system`` / ``developer``  SYSTEM (whole message)
``tool`` / ``function``     TOOL_OUTPUT (whole message)
``assistant``               ``reasoning_content`` / ``reasoning`` field -> REASONING,
                            then content split by the assistant rules below (rest is
                            ASSISTANT_HISTORY), then ``tool_calls`` (JSON, sorted keys)
                            -> ASSISTANT_HISTORY
``user``                    split by the user rules below; unmarked text USER_QUERY
other roles                 UNKNOWN (whole message)
==========================  ==========================================================

Content rules (``RULES``, in match order)
-----------------------------------------

A *span* rule covers exactly what it matches; after it, the enclosing section's type resumes.
A *header* rule must start a line (leading spaces/tabs allowed) and opens a section that runs
until the next match of any rule. Where two rules match at the same position the earlier one
wins. Markers are case-sensitive in the spellings listed (``CONTEXT:`` or ``Context:``).

=================  ======  =========  =================  ========================================
name               kind    roles      type               matches
=================  ======  =========  =================  ========================================
(caller template)  span    user       TEMPLATE           each string in ``templates``, verbatim
code_fence         span    user       CODE               ````` ``` ````` ... ````` ``` `````
                                                         (or ``~~~``); unclosed: to the end
document_tag       span    user       RETRIEVED_CONTEXT  ``<document ...>`` ... ``</document>``;
                                                         unclosed: to the end
think_tag          span    assistant  REASONING          ``<think>`` ... ``</think>``; unclosed:
                                                         to the end
think_open         span    assistant  REASONING          text before a ``</think>`` with no
                                                         ``<think>`` (templates that pre-open it)
template_header    header  user       TEMPLATE           ``TEMPLATE:``
context_header     header  user       RETRIEVED_CONTEXT  ``CONTEXT:``
document_header    header  user       RETRIEVED_CONTEXT  ``Document:``, ``Document 3:``,
                                                         ``Doc A:``
document_bracket   header  user       RETRIEVED_CONTEXT  ``[Document 3]``, ``[Doc 2: title]``
exhibit            header  user       LEGAL_EVIDENCE     ``EXHIBIT``, ``Exhibit A``
clause             header  user       LEGAL_EVIDENCE     ``Clause 7``, ``Clause 7.2``
section            header  user       LEGAL_EVIDENCE     ``Section 4.1``, ``§ 12``, ``Section 4:``
whereas            header  user       LEGAL_EVIDENCE     ``WHEREAS``, ``Whereas``
article            header  user       LEGAL_EVIDENCE     ``Article 5``, ``ARTICLE IV``
user_header        header  user       USER_QUERY         ``USER:``, ``Question:``, ``Query:``
=================  ======  =========  =================  ========================================

So each ``Document N:`` / ``<document>`` is its own segment and gets its own content hash.
A ``<document ...>`` tag's attributes hold no ``<`` or ``>`` (as in XML, where ``<`` in an
attribute must be escaped).
Sections run to the next marker: a question written after the last document without a
``Question:`` / ``USER:`` marker stays inside that document's segment.

Text, hashing and tokens
------------------------

- Each piece is trimmed of leading/trailing whitespace and empty pieces are dropped; nothing
  else is removed, so the segments' texts, in order, hold every non-whitespace character of the
  message contents. Markers (``Document 2:``) stay in their segment's text.
- ``content_hash`` is ``skv.model.content_hash`` of the trimmed segment text only: no role
  framing, no position. The same document therefore hashes identically in any message of any
  request (a different label, ``Document 1:`` vs ``Document 2:``, is different text and hashes
  differently, as the engine's tokens also differ).
- ``num_tokens`` comes from the tokenizer (``skv.tokenize``) on the trimmed text. Chat-template
  tokens (role headers, separators) and inter-segment whitespace are not counted.
- ``redact=True`` (default) keeps no text; ``keep_token_ids=True`` keeps token ids.
- Output is a pure function of the input: same messages -> identical segments.
- Non-text content parts (images, audio) are skipped: their token cost is model-specific.
- ``tools`` must be a list (or other non-string sequence) of definitions; anything else is a
  ValueError, as is a malformed message.

Cost
----

Every rule matches in time linear in the text: no rule can scan the same characters again from
each of many start positions (``tests/test_segmenter_linear.py`` runs 1 MB adversarial inputs
per rule under a time bound). A rule declares the characters its matches begin with
(``Rule.first``; ``^`` for rules that only match at a line start) so the scan skips every other
position at once.
"""

from __future__ import annotations

import json
import logging
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from enum import StrEnum
from functools import lru_cache
from typing import Any

from skv.model import Request, Segment, SemanticType, content_hash
from skv.tokenize import Tokenizer, get_tokenizer

logger = logging.getLogger(__name__)

T = SemanticType
USER = "user"
ASSISTANT = "assistant"


class RuleKind(StrEnum):
    SPAN = "span"
    HEADER = "header"


@dataclass(frozen=True, slots=True)
class Rule:
    """One segmentation rule: a regex (compiled with MULTILINE | DOTALL) and the type it gives.

    Header patterns are wrapped so they only match at a line start. ``first``: the characters
    a match can begin with, ``"^"`` for a rule that only matches at a line start (headers; a
    ``\\A`` pattern), ``""`` for unknown (no position is skipped then).
    """

    name: str
    kind: RuleKind
    pattern: str
    stype: SemanticType
    roles: frozenset[str]
    first: str = ""


def _span(name: str, pattern: str, stype: SemanticType, first: str, role: str = USER) -> Rule:
    return Rule(name, RuleKind.SPAN, pattern, stype, frozenset({role}), first)


def _header(name: str, pattern: str, stype: SemanticType) -> Rule:
    return Rule(name, RuleKind.HEADER, pattern, stype, frozenset({USER}), "^")


_ID = r"[A-Za-z0-9#][\w.#-]*"  # a document label before a colon: 3, a, 10.1, #2
_EXHIBIT_ID = r"[A-Z0-9][\w.-]*"  # an exhibit label: A, 10.1 (capital/digit: not prose)

#: The content rules, in match order (see the module docstring's table).
RULES: tuple[Rule, ...] = (
    _span("code_fence", r"(?P<f>```|~~~).*?(?:(?P=f)|\Z)", T.CODE, "`~"),
    _span(
        "document_tag",
        # [^<>]: an unclosed tag stops at the next "<", so many of them cost linear time
        r"<(?i:document)\b[^<>]*>.*?(?:</(?i:document)\s*>|\Z)",
        T.RETRIEVED_CONTEXT,
        "<",
    ),
    _span("think_tag", r"<think>.*?(?:</think>|\Z)", T.REASONING, "<", ASSISTANT),
    _span("think_open", r"\A(?:(?!<think>).)*?</think>", T.REASONING, "^", ASSISTANT),
    _header("template_header", r"(?:TEMPLATE|Template)[ \t]*:", T.TEMPLATE),
    _header("context_header", r"(?:CONTEXT|Context)[ \t]*:", T.RETRIEVED_CONTEXT),
    _header(
        "document_header",
        rf"(?:DOCUMENT|Document|Doc)(?:[ \t]+{_ID})?[ \t]*:",
        T.RETRIEVED_CONTEXT,
    ),
    _header("document_bracket", r"\[(?:DOCUMENT|Document|Doc)\b[^\]\n]*\]", T.RETRIEVED_CONTEXT),
    _header(
        "exhibit",
        rf"(?:EXHIBIT\b(?:[ \t]+{_EXHIBIT_ID})?|Exhibit[ \t]+{_EXHIBIT_ID})",
        T.LEGAL_EVIDENCE,
    ),
    _header("clause", r"(?:CLAUSE|Clause)[ \t]+\d+(?:\.\d+)*", T.LEGAL_EVIDENCE),
    _header(
        "section",
        r"(?:SECTION|Section|§)[ \t]*(?:\d+(?:\.\d+)+|\d+(?=[ \t]*(?:[.:)]|$)))",
        T.LEGAL_EVIDENCE,
    ),
    _header("whereas", r"(?:WHEREAS|Whereas)\b", T.LEGAL_EVIDENCE),
    _header("article", r"(?:ARTICLE|Article)[ \t]+(?:\d+|[IVXLC]+)\b", T.LEGAL_EVIDENCE),
    _header("user_header", r"(?:USER|User|QUESTION|Question|QUERY|Query)[ \t]*:", T.USER_QUERY),
)

_ROLE_TYPES: dict[str, SemanticType] = {
    "system": T.SYSTEM,
    "developer": T.SYSTEM,
    "tool": T.TOOL_OUTPUT,
    "function": T.TOOL_OUTPUT,
}
_TEXT_PART_TYPES = frozenset({"text", "input_text", "output_text"})


@dataclass(frozen=True, slots=True)
class _Compiled:
    regex: re.Pattern[str]
    rules: dict[str, Rule]  # group name -> rule


def _prefilter(rules: Sequence[Rule]) -> str:
    """A lookahead that fails at once where no rule's match can begin ("" if unknown)."""
    if any(not r.first for r in rules):
        return ""
    chars = "".join(sorted({c for r in rules if r.first != "^" for c in r.first}))
    if not chars:
        return "(?=^)"
    return f"(?=[{''.join(re.escape(c) for c in chars)}]|^)"


@lru_cache(maxsize=64)
def _compile(role: str, templates: tuple[str, ...], prefilter: bool = True) -> _Compiled | None:
    """One alternation of all rules for a role, so a single scan finds the next marker.

    Python's alternation takes the leftmost match and, at equal positions, the first listed
    alternative: exactly "earliest marker, ties broken by rule order". ``prefilter``: skip the
    positions where no rule can begin (same matches, several times faster).
    """
    rules: list[Rule] = []
    if role == USER:
        # longest first, so a template that extends another wins
        for i, t in enumerate(sorted(set(templates), key=lambda s: (-len(s), s))):
            if t.strip():
                rules.append(_span(f"template_{i}", re.escape(t), T.TEMPLATE, t[0]))
    rules.extend(r for r in RULES if role in r.roles)
    if not rules:
        return None
    alts = []
    by_group: dict[str, Rule] = {}
    for i, rule in enumerate(rules):
        group = f"r{i}"
        # rename back-reference groups so each alternative's names stay unique
        pat = re.sub(r"\(\?P(<|=)(\w+)", lambda m, g=group: f"(?P{m[1]}{g}_{m[2]}", rule.pattern)
        if rule.kind is RuleKind.HEADER:
            pat = rf"^[ \t]*(?:{pat})"
        alts.append(f"(?P<{group}>{pat})")
        by_group[group] = rule
    pattern = "|".join(alts)
    if prefilter and (look := _prefilter(rules)):
        pattern = f"{look}(?:{pattern})"
    return _Compiled(re.compile(pattern, re.MULTILINE | re.DOTALL), by_group)


def split_text(
    text: str,
    role: str = USER,
    default: SemanticType = T.USER_QUERY,
    templates: Iterable[str] = (),
) -> list[tuple[SemanticType, str]]:
    """Cut one message's text into (type, trimmed text) pieces by the rules for ``role``.

    Exposed for inspection and tests; ``segment_messages`` is the usual entry point.
    """
    compiled = _compile(role, tuple(templates))
    if compiled is None:
        return _keep([(default, text)])
    raw: list[tuple[SemanticType, str]] = []
    section = default
    pos = 0
    for m in compiled.regex.finditer(text):
        group = m.lastgroup
        assert group is not None
        # lastgroup may name an inner (back-reference) group; map back to the rule's group
        rule = compiled.rules[group.split("_", 1)[0]]
        raw.append((section, text[pos : m.start()]))
        if rule.kind is RuleKind.HEADER:
            section = rule.stype
            pos = m.start()
        else:
            raw.append((rule.stype, m.group()))
            pos = m.end()
    raw.append((section, text[pos:]))
    return _keep(raw)


def _keep(pieces: list[tuple[SemanticType, str]]) -> list[tuple[SemanticType, str]]:
    out = []
    for stype, piece in pieces:
        piece = piece.strip()
        if piece:
            out.append((stype, piece))
    return out


def _dumps(obj: Any) -> str:
    """Deterministic JSON: sorted keys, so equal definitions give equal text and hashes."""
    return json.dumps(obj, sort_keys=True, ensure_ascii=False, default=str)


def _content_text(content: Any, where: str) -> str:
    """A message's text: a string, or its text parts joined by newlines (as chat templates do)."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, Sequence):
        texts = []
        for j, part in enumerate(content):
            if isinstance(part, str):
                texts.append(part)
            elif isinstance(part, Mapping):
                ptype = part.get("type", "text")
                if ptype in _TEXT_PART_TYPES and isinstance(part.get("text"), str):
                    texts.append(part["text"])
                else:
                    logger.debug("%s part %d: skipping non-text part of type %r", where, j, ptype)
            else:
                raise ValueError(f"{where} part {j}: expected a dict or str, got {type(part)}")
        return "\n".join(texts)
    raise ValueError(f"{where}: content must be a string, a list of parts or null")


class Segmenter:
    """Segments requests with one tokenizer and settings; reuse it across many requests."""

    def __init__(
        self,
        tokenizer: Tokenizer | str | None = None,
        *,
        redact: bool = True,
        keep_token_ids: bool = False,
        templates: Iterable[str] = (),
    ) -> None:
        self.tokenizer = get_tokenizer(tokenizer)
        self.redact = redact
        self.keep_token_ids = keep_token_ids
        self.templates = tuple(templates)

    def _segment(self, stype: SemanticType, text: str) -> Segment:
        ids = self.tokenizer.encode(text) if self.keep_token_ids else None
        return Segment(
            stype=stype,
            num_tokens=len(ids) if ids is not None else self.tokenizer.count(text),
            content_hash=content_hash(text),
            text=None if self.redact else text,
            token_ids=ids,
        )

    def pieces(
        self, messages: Sequence[Mapping[str, Any]], tools: Sequence[Any] | None = None
    ) -> list[tuple[SemanticType, str]]:
        """The (type, text) pieces of a chat request, in prompt order, before tokenizing."""
        out: list[tuple[SemanticType, str]] = []
        if tools is not None and (
            isinstance(tools, str | bytes | Mapping) or not isinstance(tools, Sequence)
        ):
            raise ValueError(f"'tools' must be a list, got {type(tools).__name__}")
        if tools:
            out.extend(_keep([(T.TOOL_SCHEMA, _dumps(list(tools)))]))
        for i, msg in enumerate(messages):
            where = f"message {i}"
            if not isinstance(msg, Mapping):
                raise ValueError(f"{where}: expected a dict, got {type(msg).__name__}")
            role = msg.get("role")
            if not isinstance(role, str):
                raise ValueError(f"{where}: missing or non-string 'role'")
            text = _content_text(msg.get("content"), where)
            if role == USER:
                out.extend(split_text(text, USER, T.USER_QUERY, self.templates))
            elif role == ASSISTANT:
                for key in ("reasoning_content", "reasoning"):
                    if isinstance(msg.get(key), str):
                        out.extend(_keep([(T.REASONING, msg[key])]))
                        break
                out.extend(split_text(text, ASSISTANT, T.ASSISTANT_HISTORY))
                if msg.get("tool_calls"):
                    out.extend(_keep([(T.ASSISTANT_HISTORY, _dumps(msg["tool_calls"]))]))
            elif role in _ROLE_TYPES:
                out.extend(_keep([(_ROLE_TYPES[role], text)]))
            else:
                logger.debug("%s: unknown role %r -> UNKNOWN", where, role)
                out.extend(_keep([(T.UNKNOWN, text)]))
        return out

    def messages(
        self, messages: Sequence[Mapping[str, Any]], tools: Sequence[Any] | None = None
    ) -> list[Segment]:
        return [self._segment(st, txt) for st, txt in self.pieces(messages, tools)]

    def text(self, text: str) -> list[Segment]:
        """A raw completion prompt, segmented as one user message."""
        return self.messages([{"role": USER, "content": text}])


def segment_messages(
    messages: Sequence[Mapping[str, Any]],
    tools: Sequence[Any] | None = None,
    tokenizer: Tokenizer | str | None = None,
    redact: bool = True,
    *,
    keep_token_ids: bool = False,
    templates: Iterable[str] = (),
) -> list[Segment]:
    """Typed segments of an OpenAI-style chat request (see the module docstring for rules)."""
    seg = Segmenter(tokenizer, redact=redact, keep_token_ids=keep_token_ids, templates=templates)
    return seg.messages(messages, tools)


def segment_text(
    text: str,
    tokenizer: Tokenizer | str | None = None,
    redact: bool = True,
    *,
    keep_token_ids: bool = False,
    templates: Iterable[str] = (),
) -> list[Segment]:
    """Typed segments of a raw completion prompt, treated as a single user message."""
    seg = Segmenter(tokenizer, redact=redact, keep_token_ids=keep_token_ids, templates=templates)
    return seg.text(text)


def build_request(
    request_id: str,
    arrival_s: float,
    messages: Sequence[Mapping[str, Any]],
    *,
    tools: Sequence[Any] | None = None,
    output_tokens: int = 0,
    session_id: str | None = None,
    tenant_id: str | None = None,
    turn: int | None = None,
    tokenizer: Tokenizer | str | None = None,
    redact: bool = True,
    keep_token_ids: bool = False,
    templates: Iterable[str] = (),
) -> Request:
    """A `Request` from a chat request; ``templated`` is set when any TEMPLATE segment exists."""
    segments = segment_messages(
        messages,
        tools,
        tokenizer,
        redact,
        keep_token_ids=keep_token_ids,
        templates=templates,
    )
    return Request(
        request_id=request_id,
        arrival_s=arrival_s,
        segments=segments,
        output_tokens=output_tokens,
        session_id=session_id,
        tenant_id=tenant_id,
        turn=turn,
        templated=any(s.stype is T.TEMPLATE for s in segments),
    )
