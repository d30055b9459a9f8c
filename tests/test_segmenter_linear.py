"""The segmenter's rules run in linear time: ~1 MB adversarial inputs per rule, timed.

Each rule of ``skv.segmenter.RULES`` has inputs built to make a backtracking regex rescan the
text from many start positions (an unclosed ``<document `` repeated took 6.7 s for 0.5 MB and
grew quadratically). The bound is relative to plain prose of the same size, measured in the same
run, so a slow machine does not fail it and a quadratic rule (tens of seconds) cannot pass.
"""

from __future__ import annotations

import time

import pytest

from skv.segmenter import ASSISTANT, RULES, USER, Segmenter, _compile, split_text

SIZE = 1_000_000


def _fill(unit: str, head: str = "", tail: str = "") -> str:
    """``head`` + ``unit`` repeated to ~SIZE characters + ``tail``."""
    return head + unit * max(1, (SIZE - len(head) - len(tail)) // len(unit)) + tail


#: rule name -> inputs that stress it (several per rule: unclosed, almost-matching, long runs)
ADVERSARIAL: dict[str, list[str]] = {
    "code_fence": [_fill("```"), _fill("`", "~~~"), _fill("~", "```"), _fill("``` ~~~ ")],
    "document_tag": [
        _fill("<document "),
        _fill("<DoCuMeNt a=1 "),
        _fill("</document ", "<document>"),
        _fill(" ", "<document></document"),
        _fill("a", "<document "),
        _fill("<document x>"),
    ],
    "think_tag": [_fill("<think>"), _fill("<think"), _fill("</think", "<think>")],
    "think_open": [_fill("</think"), _fill("<think"), _fill("x"), _fill("</thin")],
    "template_header": [_fill(" ", "Template"), _fill("TEMPLATE \t\n"), _fill("\t", "  TEMPLATE")],
    "context_header": [_fill("\t", "Context"), _fill("CONTEXT\n")],
    "document_header": [
        _fill("a", "Doc "),
        _fill(".", "Document #"),
        _fill("Doc a\n"),
        _fill("Document"),
    ],
    "document_bracket": [_fill("[Doc "), _fill("x", "[Document"), _fill("[Doc x\n")],
    "exhibit": [_fill("A", "EXHIBIT ", "!"), _fill("1.", "Exhibit "), _fill("Exhibit\n")],
    "clause": [_fill("1.", "Clause "), _fill("Clause 1\n"), _fill(" ", "Clause")],
    "section": [
        _fill("1", "§ "),
        _fill(" ", "Section 1", "x"),
        _fill("1.", "Section ", "x"),
        _fill("§ 1 \n"),
    ],
    "whereas": [_fill("Whereas"), _fill("WHEREAS_")],
    "article": [_fill("I", "Article ", "x"), _fill("1", "ARTICLE ", "x"), _fill("Article\n")],
    "user_header": [_fill(" ", "Question"), _fill("QUERY \t"), _fill("User\n")],
}
#: stress for the scan as a whole: line starts everywhere, long whitespace runs
GENERIC = [_fill("\n"), _fill(" \t"), _fill(" " * 999 + "\n"), _fill("<"), _fill("`~<[§")]


def _timed(fn, *args) -> float:
    t0 = time.perf_counter()
    fn(*args)
    return time.perf_counter() - t0


@pytest.fixture(scope="module")
def bound() -> float:
    """Seconds allowed per 1 MB input: 30x plain prose of the same size, at least 5 s. The
    slowest rule takes 0.57 s on the idle 2-core VM (2026-12-01) and took 2.03 s once in a full
    run, over the 2 s floor this had; a quadratic rule takes tens of seconds (44 s before)."""
    prose = _fill("The parties agree that the deliverables are due in May. \n")
    base = min(_timed(split_text, prose, role) for role in (USER, ASSISTANT) for _ in range(2))
    return max(5.0, 30 * base)


def test_every_rule_has_adversarial_inputs():
    assert {r.name for r in RULES} <= set(ADVERSARIAL)


@pytest.mark.parametrize("name", sorted(ADVERSARIAL))
def test_rule_is_linear_on_adversarial_input(name, bound):
    for text in ADVERSARIAL[name]:
        for role in (USER, ASSISTANT):
            dt = _timed(split_text, text, role)
            assert dt < bound, f"{name} ({role}): {len(text)} chars {text[:24]!r}... {dt:.2f} s"


def test_scan_is_linear_on_generic_stress(bound):
    for text in GENERIC:
        for role in (USER, ASSISTANT):
            dt = _timed(split_text, text, role)
            assert dt < bound, f"{role}: {text[:16]!r}... {dt:.2f} s"


def test_whole_request_with_adversarial_content_is_bounded(bound):
    """Through the Segmenter (tokenizer and hashing included), as the services run it."""
    msgs = [{"role": "user", "content": ADVERSARIAL["document_tag"][0]}]
    assert _timed(Segmenter().messages, msgs) < 3 * bound


@pytest.mark.parametrize("role", [USER, ASSISTANT])
def test_prefilter_changes_no_match(role):
    """The first-character prefilter only skips positions where no rule can begin."""
    fast, slow = _compile(role, ()), _compile(role, (), False)
    assert fast is not None and slow is not None and fast.regex.pattern != slow.regex.pattern
    texts = [t[:2000] for ts in ADVERSARIAL.values() for t in ts] + [
        "intro\n```py\ncode\n```\nCONTEXT: a\n  Document 2: b\n[Doc 3] c <document id=1>d"
        "</document>\nSection 4.1 e\n§ 12. f\nWhereas g\nArticle IV h\nQuestion: i",
        "reasoning</think>answer <think>more</think> tail ~~~x~~~",
    ]
    for text in texts:
        spans = [(m.span(), m.lastgroup) for m in fast.regex.finditer(text)]
        assert spans == [(m.span(), m.lastgroup) for m in slow.regex.finditer(text)], text[:60]


def test_template_prefilter_uses_the_template_first_char():
    pieces = split_text("intro\nFill in: name\nrest", USER, templates=["Fill in:"])
    assert [p[1] for p in pieces] == ["intro", "Fill in:", "name\nrest"]
