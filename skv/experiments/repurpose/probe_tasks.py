"""Seeded question-answering items for the KV-Repurpose quality probe (no downloads, stdlib only).

Every item is a chat prompt cut into segments the way a RAG server would cache them: a fixed
system prompt and user-turn header (a true prefix), ``docs`` documents (each a warehouse record:
the items it stocks, then one line per item with a four-digit code), and the question with the
start of the assistant's reply (``answer_prefix``), so the model's next tokens are the answer
and exact match needs no parsing of free text. Three tasks, one seed:

- ``lookup`` (single document, key-value): "What is the code for kettles in Warehouse Birch?"
  answered by one line of one document; chance ~0 (a four-digit code).
- ``first_item`` (single document, recall of order): "Which item does Warehouse Birch list
  first?" answered by the first name of one document's list; chance 1 in ``items``.
- ``compare`` (cross-document): two documents stock the same item under different codes;
  "Which warehouse has the larger code for kettles, Birch or Cedar?" needs both values;
  chance 1 in 2 (the answer is one of the two names, in random order in the question).

Invariants: items depend only on ``(seed, task, index)``; a document never repeats a
warehouse or an item; codes within an item are distinct, so every question has one answer.
:func:`extract` reads the answer from generated text: the first candidate (code, item or
warehouse name) it contains, else None.
"""

from __future__ import annotations

import random
import re
from dataclasses import dataclass

TASKS = ("lookup", "first_item", "compare")
TASK_LABELS = {
    "lookup": "lookup (1 doc)",
    "first_item": "first item (1 doc)",
    "compare": "compare (2 docs)",
}
ITEMS = (
    "lamps", "kettles", "mirrors", "chairs", "tables", "clocks", "brushes", "candles",
    "blankets", "baskets", "cups", "plates", "boxes", "ropes", "hammers", "ladders",
)  # fmt: skip
PLACES = (
    "Alder", "Birch", "Cedar", "Dune", "Elm", "Fern", "Grove", "Harbor",
    "Iris", "Juniper", "Kestrel", "Lark", "Maple", "Nettle", "Oak", "Pine",
)  # fmt: skip
SYSTEM = (
    "<|im_start|>system\nYou are a helpful assistant. Answer from the documents.<|im_end|>\n"
    "<|im_start|>user\n"
)
QUESTION_END = "<|im_end|>\n<|im_start|>assistant\n"
#: generated tokens are cut after this many (an answer is a code of 4 digits or one name)
MAX_NEW_TOKENS = {"lookup": 5, "first_item": 4, "compare": 4}


@dataclass(frozen=True)
class Record:
    place: str
    items: tuple[str, ...]
    codes: tuple[int, ...]

    def text(self) -> str:
        lines = [f"Warehouse {self.place} stocks {', '.join(self.items)}."]
        lines += [
            f"In Warehouse {self.place}, the code for {it} is {c}."
            for it, c in zip(self.items, self.codes, strict=True)
        ]
        return "\n".join(lines) + "\n\n"


@dataclass(frozen=True)
class ProbeItem:
    task: str
    index: int
    documents: tuple[str, ...]
    #: indices of the documents the answer needs (one, or two for ``compare``)
    needs: tuple[int, ...]
    question: str
    answer_prefix: str
    answer: str
    candidates: tuple[str, ...]
    chance: float

    @property
    def suffix(self) -> str:
        """The segment after the documents: question, end of turn, start of the reply."""
        return f"Question: {self.question}{QUESTION_END}{self.answer_prefix}"


def _records(rng: random.Random, docs: int, items: int, shared: str | None) -> list[Record]:
    places = rng.sample(PLACES, docs)
    out = []
    for p in places:
        its = rng.sample([i for i in ITEMS if i != shared], items - (shared is not None))
        if shared is not None:
            its.insert(rng.randrange(len(its) + 1), shared)
        out.append(Record(p, tuple(its), tuple(rng.randint(1000, 9999) for _ in its)))
    return out


def make_item(seed: int, task: str, index: int, *, docs: int = 3, items: int = 3) -> ProbeItem:
    """Item ``index`` of ``task`` for ``seed``: ``docs`` documents of ``items`` lines each."""
    if task not in TASKS:
        raise ValueError(f"unknown probe task {task!r}; one of {', '.join(TASKS)}")
    if not 2 <= docs <= len(PLACES) or not 2 <= items <= len(ITEMS) // 2:
        raise ValueError(f"docs must be in [2, {len(PLACES)}] and items in [2, {len(ITEMS) // 2}]")
    rng = random.Random(f"skv-probe/{seed}/{task}/{index}")
    if task == "compare":
        shared = rng.choice(ITEMS)
        recs = _records(rng, docs, items, shared)
        a, b = rng.sample(range(docs), 2)
        ca, cb = (recs[k].codes[recs[k].items.index(shared)] for k in (a, b))
        while ca == cb:  # one answer only
            cb = rng.randint(1000, 9999)
            r = recs[b]
            codes = list(r.codes)
            codes[r.items.index(shared)] = cb
            recs[b] = Record(r.place, r.items, tuple(codes))
        pa, pb = recs[a].place, recs[b].place
        question = (
            f"Which warehouse has the larger code for {shared}, Warehouse {pa} or Warehouse {pb}?"
        )
        return ProbeItem(
            task,
            index,
            tuple(r.text() for r in recs),
            (a, b),
            question,
            f"The larger code for {shared} is in Warehouse",
            pa if ca > cb else pb,
            (pa, pb),
            0.5,
        )
    recs = _records(rng, docs, items, None)
    k = rng.randrange(docs)
    r = recs[k]
    texts = tuple(x.text() for x in recs)
    if task == "lookup":
        j = rng.randrange(items)
        return ProbeItem(
            task,
            index,
            texts,
            (k,),
            f"What is the code for {r.items[j]} in Warehouse {r.place}?",
            f"The code for {r.items[j]} in Warehouse {r.place} is",
            str(r.codes[j]),
            (),
            1e-4,
        )
    return ProbeItem(
        task,
        index,
        texts,
        (k,),
        f"Which item does Warehouse {r.place} list first?",
        f"Warehouse {r.place} stocks",
        r.items[0],
        r.items,
        1.0 / items,
    )


def make_items(seed: int, task: str, n: int, *, docs: int = 3, items: int = 3) -> list[ProbeItem]:
    return [make_item(seed, task, i, docs=docs, items=items) for i in range(n)]


def extract(item: ProbeItem, text: str) -> str | None:
    """The answer ``text`` gives: its first four-digit number (``lookup``), else the candidate
    (item or warehouse name) that occurs first in it; None when it names none."""
    if item.task == "lookup":
        m = re.search(r"\d{4}", text)
        return m.group(0) if m else None
    low = text.lower()
    found = [(low.find(c.lower()), c) for c in item.candidates if c.lower() in low]
    if not found:
        return None
    return min(found)[1]
