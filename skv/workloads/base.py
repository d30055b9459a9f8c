"""Shared machinery of the synthetic workloads: parameters, seeded text, arrivals, rendering.

Every workload follows the same two steps:

1. *plan*: draw arrivals, sessions and content choices from seeded random streams and build
   :class:`Chat` objects (OpenAI-style messages whose texts come from :class:`TextGen`);
2. *render*: :class:`Renderer` runs each chat through one :class:`skv.segmenter.Segmenter` and
   returns ``list[Request]`` sorted by arrival.

Determinism: every random stream is a numpy ``Generator`` seeded from ``(seed, a stable hash of
the stream's name, ...)``, never from global state, so the same parameters give identical
requests (segments, content hashes, arrivals) in any process. A text is a pure function of
``(seed, kind, key)``: the same document is the same string, and hashes identically, in every
request that cites it.

Speed: message contents are kept as tuples of *sections* (joined by ``"\\n"`` only when the chat
is exported) and the renderer segments each distinct section once. Sections are cut where a
segmenter marker starts a line (``Document 12:``, ``Exhibit A``, ``Question:``, a ``<think>``
span), so segmenting sections one by one gives exactly the segments of the whole message; a
test checks this against ``Segmenter.messages`` on every workload.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from pydantic import BaseModel, ConfigDict, Field

from skv.model import Request, Segment, SemanticType, content_hash
from skv.segmenter import Segmenter
from skv.tokenize import SimpleTokenizer

#: The word list of the synthetic text: common English words of at most 6 letters, so that
#: ``SimpleTokenizer`` counts exactly one token per word (and one per sentence's period).
#: No word is a segmenter marker (``Whereas``, ``Section``, ``Exhibit`` ...), so generated
#: prose never opens a typed section by accident.
_WORDS = """
    able about above accept access across act action active actual add adjust admit adopt
    advice affect after again agency agent agree ahead aim allow almost alone along also
    always amount annual answer any appeal apply area argue around arrive art ask asset
    assume attach attend audit author avoid award aware away back badge bank base basic
    basis batch become before begin behind belief below best better beyond bill board body
    bond book border borrow both bottom branch brief bring broad budget build burden buyer
    call camera campus can cancel cap carbon card care career carry case cash cause center
    chain chair change charge chart check choice choose city civil claim class clear client
    close cloud code coffee cold column common cost count county couple course cover create
    credit crisis critic cross crowd cup curve custom cycle daily damage data date deal
    debate debt decade decide deep defend define degree delay demand deny depend design desk
    detail device differ direct doctor dollar domain double draft drive during duty each
    early earn easy edge effect effort either elect email employ enable end energy engine
    enough ensure enter entire entry equal error escape estate event every exact exist
    expand expect expert export extend extra fact factor fail fair family farm fast fault
    favor fee field figure file final find firm first fiscal fit fixed flat fleet flow focus
    follow force form format former forum frame free fresh front fuel full fund future gain
    garden gather gift global goal good grant great green ground group grow growth guard
    guest guide half hand handle happen hard health hear heavy help high hold home hope
    hotel hour house human idea impact import income index inform input inside intend invest
    issue item job join joint judge keep key kind know labor land large last late launch law
    layer lead learn least leave legal length lender letter level light likely limit line
    link list listen little live load loan local locate logic long loss lower main major
    make manage margin mark market master matter may media meet member memory method middle
    might mind minor mode model modern moment money month more most motion move much must
    name nation native nature near need net never new next night noise normal note notice
    number object obtain occur offer office often only open option order origin other output
    owner page panel paper parent part party pass past path patent pay people period permit
    person phase phone pick piece place plan plant player point policy pool port power
    prefer press price prime prior probe profit proper public pull push put quick quiet
    quite quote raise range rapid rate rather reach read ready real reason recent record
    reduce refer reform region relate rely remain remote remove render rent repair repeat
    reply report rest result retail return review reward right rise risk road role room rule
    safe sale sample save scale scene scheme school scope score screen search season second
    secure select sell send senior sense series serve set settle share shift short should
    show side sign signal simple single site size skill small social soft solid solve source
    space speak spend spread staff stage stand start state status stay steady step still
    stock store story street strong study style submit supply sure survey system table take
    talent target task team term test text theory thing think third ticket time title today
    topic total toward track trade train travel treat trend trial true trust try turn type
    under union unit until update upon usage use useful user valid value vendor verify view
    visit vote wage wait walk want watch water wealth week weight while whole wide will
    window within work world worth write year yield young zone
"""
VOCABULARY: tuple[str, ...] = tuple(_WORDS.split())

_MAX_CACHED_SECTIONS = 500_000
#: characters no elided middle may hold (see Renderer._elided)
_ELIDE_UNSAFE = ("\n", "\r", "`", "~", "<", ">", "[", "]")


# ----------------------------------------------------------------------------------------
# parameters

#: Bounds on the sizes a config may ask for (configs are checked against them at load, so a
#: typo such as ``num_requests: 1000000000000`` fails in milliseconds, naming the field):
#:
#: - ``MAX_REQUESTS``: generation keeps every request (segments, content hashes) in memory,
#:   ~3 KB each, and the simulator adds its own state per request: 10^6 requests is a few GB and
#:   minutes of generation, ~700x the suite's largest config (1,500).
#: - ``MAX_MEAN_TOKENS``: a mean length above 2**20 tokens (1M) exceeds every served model's
#:   context window; generated text is built word by word (~6 bytes a token).
#: - ``MAX_CATALOGUE``: distinct items (documents, clauses, prompts, templates, tool sets,
#:   tool arguments): tables of one float per item are built up front.
#: - ``MAX_PER_REQUEST``: items one request or session takes (documents, exhibits, clauses,
#:   tools, turns, steps, questions): beyond 1024 a prompt outgrows any context window at the
#:   default lengths.
MAX_REQUESTS = 1_000_000
MAX_MEAN_TOKENS = 1 << 20
MAX_CATALOGUE = 1_000_000
MAX_PER_REQUEST = 1024


class WorkloadParams(BaseModel):
    """Parameters every workload takes.

    - ``seed``: the root of every random stream and of every generated text.
    - ``num_requests``: exactly this many requests are returned (session workloads keep the
      earliest ``num_requests`` requests of their sessions, so a late session can be cut short).
    - ``rate_rps``: mean request arrival rate (requests per second). Single-request workloads
      arrive as a Poisson process at this rate; session workloads start sessions as a Poisson
      process at ``rate_rps / mean turns per session``, which gives this long-run request rate
      (lower during the first session lifetime, while sessions ramp up).
    - ``length_sigma``: spread of every length distribution. A length with mean ``m`` is drawn
      lognormal with ``sigma = length_sigma`` and mean ``m`` (0 = every length exactly ``m``).
    - ``keep_text``: keep segment texts on the requests (``Segment.text``), for inspection.
    - ``tokenizer``: ``None`` / ``"simple"`` (default ``SimpleTokenizer``: the generated prose
      has exactly the requested number of tokens) or a local HuggingFace ``tokenizer.json``.

    Sizes are bounded (``num_requests`` <= ``MAX_REQUESTS``, mean lengths <= ``MAX_MEAN_TOKENS``,
    ...; reasons above the class).
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    seed: int = Field(default=0, ge=0)
    num_requests: int = Field(default=1000, ge=1, le=MAX_REQUESTS)
    rate_rps: float = Field(default=10.0, gt=0, allow_inf_nan=False)
    length_sigma: float = Field(default=0.3, ge=0, le=2)
    keep_text: bool = False
    tokenizer: str | None = None


def Tokens(default: int, description: str) -> Any:
    """A mean length in tokens (1 .. ``MAX_MEAN_TOKENS``)."""
    return Field(default=default, ge=1, le=MAX_MEAN_TOKENS, description=description)


def Fraction(default: float, description: str) -> Any:
    """A probability in [0, 1]."""
    return Field(default=default, ge=0, le=1, description=description)


def Seconds(default: float, description: str) -> Any:
    """A positive, finite duration in seconds (e.g. a median think time)."""
    return Field(default=default, gt=0, allow_inf_nan=False, description=description)


def LogSpread(default: float, description: str) -> Any:
    """A lognormal sigma (log-space spread) in [0, 5]."""
    return Field(default=default, ge=0, le=5, description=description)


def check_order(params: BaseModel, low: str, high: str) -> None:
    """Refuse parameters whose ``low`` field exceeds their ``high`` field (min/max pairs)."""
    lo, hi = getattr(params, low), getattr(params, high)
    if lo > hi:
        raise ValueError(f"{low} ({lo}) must be <= {high} ({hi})")


# ----------------------------------------------------------------------------------------
# seeded random streams and text


def stable_int(name: str) -> int:
    """A 64-bit int from a string, stable across processes (``hash(str)`` is salted)."""
    return int(content_hash(name), 16)


def rng_for(seed: int, *stream: str | int) -> np.random.Generator:
    """An independent random stream named by ``stream`` (strings are hashed stably)."""
    entropy = [seed, *(stable_int(s) if isinstance(s, str) else int(s) for s in stream)]
    return np.random.default_rng(entropy)


def draw_length(rng: np.random.Generator, mean: float, sigma: float, minimum: int = 1) -> int:
    """A lognormal length with mean ``mean`` and log-space spread ``sigma`` (0: exactly mean)."""
    if sigma <= 0:
        return max(minimum, round(mean))
    return max(minimum, round(mean * math.exp(sigma * rng.standard_normal() - sigma * sigma / 2)))


_SIMPLE = SimpleTokenizer()


def _clean_edge(char: str) -> bool:
    """A character that ends (or starts) a piece on its own side of a one-char separator."""
    return bool(char) and not char.isspace()


class TextGen:
    """Deterministic pseudo-English prose over :data:`VOCABULARY`.

    ``text(kind, key, mean_tokens)`` is a pure function of ``(seed, kind, key, mean_tokens,
    sigma)`` and memoised, so a catalogue item is generated once and is the identical string
    (same content hash) in every request. ``fresh(rng, n)`` draws one-off text (queries,
    answers) from the caller's stream.

    Prose is sentences of 6-14 words, capitalised, ending with a period, on one line; with
    ``SimpleTokenizer`` a text of ``n`` tokens has exactly ``n`` tokens (each word is one
    token, each period one).

    ``counts`` maps every text made here (prose, and prose joined to short labels by
    :meth:`join`) to its exact ``SimpleTokenizer`` token count, so the renderer need not
    tokenize long generated texts again (tokenizing costs ~0.3 us per token, the largest cost
    of generation). A test recounts every segment of every workload.
    """

    def __init__(self, seed: int) -> None:
        self.seed = seed
        self.counts: dict[str, int] = {}
        self._memo: dict[tuple, str] = {}
        self._vocab = VOCABULARY
        self._nv = len(VOCABULARY)
        caps = [w.capitalize() for w in VOCABULARY]
        self._table = np.array(
            [list(VOCABULARY), caps, [w + "." for w in VOCABULARY], [w + "." for w in caps]],
            dtype=object,
        )

    def fresh(self, rng: np.random.Generator, n_tokens: int) -> str:
        """``n_tokens`` tokens of new prose from ``rng`` (``n_tokens >= 1``)."""
        n = max(1, int(n_tokens))
        # sentence lengths in words; a sentence of k words costs k + 1 tokens (its period)
        lens = rng.integers(6, 15, size=n // 7 + 2)
        ends = np.cumsum(lens + 1)
        full = int(np.searchsorted(ends, n, side="right"))  # sentences that fit whole
        used = int(ends[full - 1]) if full else 0
        rest = n - used  # tokens left for one shorter sentence (or a lone word when 1)
        lens = lens[:full].tolist()
        if rest >= 2:
            lens.append(rest - 1)
        n_words = sum(lens) + (1 if rest == 1 else 0)
        # variant per word: +1 capitalised (sentence start), +2 with a period (sentence end)
        variant = np.zeros(n_words, dtype=np.intp)
        if lens:
            sentence_ends = np.cumsum(np.asarray(lens, dtype=np.intp))
            variant[sentence_ends - lens] += 1
            variant[sentence_ends - 1] += 2
        words = self._table[variant, rng.integers(0, self._nv, size=n_words)]
        text = " ".join(words.tolist())
        self.counts[text] = n
        return text

    def join(self, head: str, body: str, tail: str = "") -> str:
        """``head + " " + body`` (or ``head + body`` when ``head`` ends with a newline), then
        ``tail``; the count is recorded when it is provably the sum of the parts' counts.

        ``SimpleTokenizer`` pieces never cross a boundary between a non-space character and a
        single space or newline followed by a non-space character, except that a space joins
        the word after it, which ``body`` then counts (``" Word"`` and ``"Word"`` are one token
        each). Other boundaries are not recorded: the renderer then tokenizes the text.
        """
        sep = "" if head.endswith("\n") else " "
        text = f"{head}{sep}{body}{tail}"
        n = self.counts.get(body)
        if (
            n is not None
            and head
            and _clean_edge(head.removesuffix("\n")[-1:])
            and body[:1].isascii()
            and body[:1].isalpha()
            and (not tail or (tail[0] == "\n" and _clean_edge(tail[1:2]) and _clean_edge(body[-1])))
        ):
            self.counts[text] = _SIMPLE.count(head) + n + (_SIMPLE.count(tail) if tail else 0)
        return text

    def text(
        self, kind: str, key: int | tuple[int, ...], mean_tokens: float, sigma: float = 0.0
    ) -> str:
        """The catalogue text ``key`` of ``kind``: its length (lognormal around ``mean_tokens``
        with spread ``sigma``) and its words depend only on the seed, kind and key."""
        memo_key = (kind, key, mean_tokens, sigma)
        hit = self._memo.get(memo_key)
        if hit is None:
            keys = key if isinstance(key, tuple) else (key,)
            rng = rng_for(self.seed, kind, *keys)
            hit = self.fresh(rng, draw_length(rng, mean_tokens, sigma))
            self._memo[memo_key] = hit
        return hit

    def words(self, rng: np.random.Generator, n_words: int) -> list[str]:
        """``n_words`` vocabulary words (for names and short labels)."""
        return [self._vocab[w] for w in rng.integers(0, self._nv, size=n_words).tolist()]


# ----------------------------------------------------------------------------------------
# arrivals and popularity


def poisson_arrivals(rng: np.random.Generator, n: int, rate_rps: float) -> list[float]:
    """``n`` arrival times (seconds) of a Poisson process at ``rate_rps``; the first is one
    exponential gap after time 0."""
    return np.cumsum(rng.exponential(1.0 / rate_rps, size=n)).tolist()


class ZipfSampler:
    """Zipf popularity over a catalogue of ``n`` items: ``P(i) ~ 1 / (i + 1) ** alpha``.

    Item 0 is the most popular; ``alpha = 0`` is uniform.
    """

    def __init__(self, n: int, alpha: float) -> None:
        if n < 1:
            raise ValueError(f"catalogue size must be >= 1, got {n}")
        weights = np.arange(1, n + 1, dtype=float) ** -float(alpha)
        self.n = n
        self.probs = weights / weights.sum()
        self._cdf = np.cumsum(self.probs)
        self._cdf[-1] = 1.0

    def sample(self, rng: np.random.Generator, size: int) -> list[int]:
        """``size`` independent draws (with repetition)."""
        return np.searchsorted(self._cdf, rng.random(size), side="right").tolist()

    def sample_one(self, rng: np.random.Generator) -> int:
        return int(np.searchsorted(self._cdf, rng.random(), side="right"))

    def sample_distinct(self, rng: np.random.Generator, k: int) -> list[int]:
        """``k`` distinct items in draw order (popular items tend to come first), as a
        retriever's top-k would rank them; ``k`` is capped at the catalogue size."""
        k = min(k, self.n)
        if k <= 0:
            return []
        out: list[int] = []
        seen: set[int] = set()
        for _ in range(50):
            for item in self.sample(rng, 2 * (k - len(out)) + 2):
                if item not in seen:
                    seen.add(item)
                    out.append(item)
                    if len(out) == k:
                        return out
        # extreme skew: fill the rest without replacement from the remaining mass
        rest = np.array([i for i in range(self.n) if i not in seen])
        p = self.probs[rest] / self.probs[rest].sum()
        out.extend(rng.choice(rest, size=k - len(out), replace=False, p=p).tolist())
        return out


@dataclass(slots=True)
class SessionPlan:
    """One session's kept arrivals (turn ``t`` arrives at ``arrivals[t]``), and the number of
    turns it was planned with (``len(arrivals)`` is smaller when the trace cut it short)."""

    index: int
    arrivals: list[float]
    planned_turns: int


def plan_sessions(
    rng: np.random.Generator,
    num_requests: int,
    rate_rps: float,
    draw_turns: Callable[[np.random.Generator, int], np.ndarray],
    mean_turns: float,
    think_median_s: float,
    think_sigma: float,
) -> list[SessionPlan]:
    """Sessions whose turns are exactly the ``num_requests`` earliest requests.

    Sessions start as a Poisson process at ``rate_rps / mean_turns``; ``draw_turns(rng, k)``
    gives the turn counts of ``k`` sessions; consecutive turns of a session are separated by a
    lognormal think time (median ``think_median_s``, log-space spread ``think_sigma``). Sessions
    are drawn until no later session could start before the ``num_requests``-th arrival, then
    the earliest ``num_requests`` arrivals are kept: each session keeps a prefix of its turns.
    """
    session_rate = rate_rps / mean_turns
    batch = max(16, int(num_requests / mean_turns * 1.1) + 16)
    mu = math.log(think_median_s)
    turn_counts: list[np.ndarray] = []
    times: list[np.ndarray] = []
    t = 0.0
    total = 0
    while True:
        st = t + np.cumsum(rng.exponential(1.0 / session_rate, size=batch))
        t = float(st[-1])
        nt = np.maximum(1, np.asarray(draw_turns(rng, batch), dtype=np.int64))
        gaps = rng.lognormal(mu, think_sigma, size=int(nt.sum()))
        # turn k of a session arrives at start + (sum of its first k gaps); turn 0 at start
        first = np.cumsum(nt) - nt
        gaps[first] = 0.0
        csum = np.cumsum(gaps)
        arr = np.repeat(st, nt) + (csum - np.repeat(csum[first], nt))
        turn_counts.append(nt)
        times.append(arr)
        total += int(nt.sum())
        if total >= num_requests:
            all_times = np.concatenate(times)
            cutoff = np.partition(all_times, num_requests - 1)[num_requests - 1]
            if t > cutoff:
                break
    nt_all = np.concatenate(turn_counts)
    times_all = np.concatenate(times)
    session_of = np.repeat(np.arange(len(nt_all)), nt_all)
    turn_of = np.arange(len(times_all)) - np.repeat(np.cumsum(nt_all) - nt_all, nt_all)
    order = np.lexsort((turn_of, session_of, times_all))[:num_requests]
    kept = np.zeros(len(times_all), dtype=bool)
    kept[order] = True
    plans: list[SessionPlan] = []
    pos = 0
    times_list = times_all.tolist()
    kept_list = kept.tolist()
    for s, n in enumerate(nt_all.tolist()):
        arrivals = [times_list[pos + k] for k in range(n) if kept_list[pos + k]]
        if arrivals:
            plans.append(SessionPlan(s, arrivals, n))
        pos += n
    return plans


# ----------------------------------------------------------------------------------------
# chats and rendering


@dataclass(slots=True)
class Message:
    """One chat message; its content is ``"\\n".join(sections)`` (None when no sections).

    A section must start at a segmenter marker (or be the first section of the message), so
    that segmenting sections one by one equals segmenting the whole content.
    """

    role: str
    sections: tuple[str, ...] = ()
    tool_calls: list[dict[str, Any]] | None = None
    tool_call_id: str | None = None

    @property
    def content(self) -> str | None:
        return "\n".join(self.sections) if self.sections else None

    def to_openai(self) -> dict[str, Any]:
        msg: dict[str, Any] = {"role": self.role, "content": self.content}
        if self.tool_calls:
            msg["tool_calls"] = self.tool_calls
        if self.tool_call_id is not None:
            msg["tool_call_id"] = self.tool_call_id
        return msg


@dataclass(slots=True)
class Chat:
    """A planned request: OpenAI-style messages (and tools), before segmentation.

    ``answer`` is the assistant message the model generates, when the workload knows it (the
    next turn quotes it); otherwise ``output_tokens`` gives the answer's length.
    """

    request_id: str
    arrival_s: float
    messages: list[Message]
    tools: list[dict[str, Any]] | None = None
    answer: Message | None = None
    output_tokens: int = 0
    session_id: str | None = None
    tenant_id: str | None = None
    turn: int | None = None
    parent_id: str | None = None
    extra: dict[str, object] = field(default_factory=dict)

    def openai_request(self) -> dict[str, Any]:
        """The ``/v1/chat/completions`` body: ``messages``, ``tools``, and ``max_tokens`` when
        the answer's length is drawn rather than known (a known answer is in ``answer``)."""
        body: dict[str, Any] = {"messages": [m.to_openai() for m in self.messages]}
        if self.tools:
            body["tools"] = self.tools
        if self.output_tokens:
            body["max_tokens"] = self.output_tokens
        return body


# a rendered piece: (type, tokens, content hash, text)
_Piece = tuple[SemanticType, int, str, str]


class Renderer:
    """Chats -> ``Request``s one ``Segmenter``; each distinct section is segmented once.

    ``output_tokens`` / ``output_hash`` of a chat with a known ``answer``: the answer's tokens
    and, when the answer is one segment (plain text, or one tool call), that segment's content
    hash, which is the hash the next turn's copy of the answer carries. An answer of several
    segments (``<think>`` + text) gets the content hash of its whole text. Either way
    ``extra["output_segments"]`` lists the answer's segments as ``[type, tokens, hash]``.
    """

    def __init__(
        self,
        tokenizer: str | None = None,
        keep_text: bool = False,
        known_counts: dict[str, int] | None = None,
    ) -> None:
        self.segmenter = Segmenter(tokenizer, redact=not keep_text)
        self.keep_text = keep_text
        # exact SimpleTokenizer counts of generated texts (TextGen.counts); other tokenizers
        # count everything themselves
        simple = isinstance(self.segmenter.tokenizer, SimpleTokenizer)
        self._known = known_counts if simple and known_counts is not None else {}
        self._sections: dict[tuple[str, str], tuple[_Piece, ...]] = {}
        self._objects: dict[int, tuple[object, tuple[_Piece, ...]]] = {}

    def count(self, text: str) -> int:
        n = self._known.get(text)
        return self.segmenter.tokenizer.count(text) if n is None else n

    def _pieces(self, messages: list[dict[str, Any]], tools: Any = None) -> tuple[_Piece, ...]:
        count = self.count
        return tuple(
            (st, count(text), content_hash(text), text)
            for st, text in self.segmenter.pieces(messages, tools)
        )

    def _section(self, role: str, text: str) -> tuple[_Piece, ...]:
        key = (role, text)
        hit = self._sections.get(key)
        if hit is None:
            if len(self._sections) >= _MAX_CACHED_SECTIONS:
                self._sections.clear()
            hit = self._elided(role, text) or self._pieces([{"role": role, "content": text}])
            self._sections[key] = hit
        return hit

    def _elided(self, role: str, text: str) -> tuple[_Piece, ...] | None:
        """Segment a long section from its head and tail when that provably gives the same
        single piece as the whole; None when it may not.

        The segmenter's scan costs ~0.1 us per character, the largest cost of generating long
        unique texts (exhibits, documents, reasoning). Here the text is cut at two spaces into
        ``head + middle + tail`` and only ``head + tail`` is segmented. That is exact when the
        middle holds no newline (headers match only at line starts) and none of
        ``` ` ~ < > [ ] ``` (every span rule and bracket header needs one of them), each cut
        is a space between a non-space character and an ASCII letter (so no rule sees a
        different character on either side of the junction), and the caller uses no templates:
        then no match can start in the middle, and a match running through it (an unclosed
        ``<think>``, a header's section) ends where it ends without it. When ``head + tail``
        is one piece, the whole text is one piece of that type. A test compares every workload
        against ``Segmenter.messages``.
        """
        if len(text) < 2048 or self.segmenter.templates:
            return None
        i = _word_cut(text, 256, 512)
        j = _word_cut(text, len(text) - 512, len(text) - 256)
        if i < 0 or j <= i or any(c in text[i:j] for c in _ELIDE_UNSAFE):
            return None
        probe_text = text[:i] + text[j:]
        probe = self.segmenter.pieces([{"role": role, "content": probe_text}])
        if len(probe) != 1 or probe[0][1] != probe_text.strip():
            return None
        whole = text.strip()
        return ((probe[0][0], self.count(whole), content_hash(whole), whole),)

    def _by_object(self, obj: object, make: Callable[[], tuple[_Piece, ...]]) -> tuple[_Piece, ...]:
        """Pieces of a JSON object (tools, tool calls) shared by identity across requests."""
        hit = self._objects.get(id(obj))
        if hit is None or hit[0] is not obj:
            if len(self._objects) >= _MAX_CACHED_SECTIONS:
                self._objects.clear()
            hit = (obj, make())  # holding obj keeps its id from being reused
            self._objects[id(obj)] = hit
        return hit[1]

    def message_pieces(self, msg: Message) -> list[_Piece]:
        out: list[_Piece] = []
        if msg.role in ("user", "assistant"):
            for section in msg.sections:
                out.extend(self._section(msg.role, section))
            if msg.tool_calls:
                calls = msg.tool_calls
                out.extend(
                    self._by_object(
                        calls,
                        lambda: self._pieces(
                            [{"role": "assistant", "content": None, "tool_calls": calls}]
                        ),
                    )
                )
        elif msg.sections:
            out.extend(self._section(msg.role, "\n".join(msg.sections)))
        return out

    def segments(self, chat: Chat) -> list[Segment]:
        pieces: list[_Piece] = []
        if chat.tools:
            tools = chat.tools
            pieces.extend(self._by_object(tools, lambda: self._pieces([], tools)))
        for msg in chat.messages:
            pieces.extend(self.message_pieces(msg))
        keep = self.keep_text
        return [Segment(st, n, h, text=t if keep else None) for st, n, h, t in pieces]

    def request(self, chat: Chat) -> Request:
        req = Request(
            request_id=chat.request_id,
            arrival_s=chat.arrival_s,
            segments=self.segments(chat),
            output_tokens=chat.output_tokens,
            session_id=chat.session_id,
            tenant_id=chat.tenant_id,
            turn=chat.turn,
            parent_id=chat.parent_id,
            templated=False,
            extra=dict(chat.extra),
        )
        req.templated = any(s.stype is SemanticType.TEMPLATE for s in req.segments)
        if chat.answer is not None:
            out = self.message_pieces(chat.answer)
            req.output_tokens = sum(p[1] for p in out)
            if len(out) == 1:
                req.output_hash = out[0][2]
            else:
                req.output_hash = content_hash(_answer_text(chat.answer))
            req.extra["output_segments"] = [[p[0].value, p[1], p[2]] for p in out]
        return req

    def render(self, chats: Iterable[Chat]) -> list[Request]:
        """Requests sorted by (arrival, request id)."""
        ordered = sorted(chats, key=lambda c: (c.arrival_s, c.request_id))
        return [self.request(c) for c in ordered]


def _word_cut(text: str, lo: int, hi: int) -> int:
    """A space in ``text[lo:hi]`` after a non-space and before an ASCII letter, or -1."""
    k = text.find(" ", max(lo, 1), hi)
    while k >= 0:
        after = text[k + 1 : k + 2]
        if after.isascii() and after.isalpha() and not text[k - 1].isspace():
            return k
        k = text.find(" ", k + 1, hi)
    return -1


def _answer_text(msg: Message) -> str:
    text = msg.content or ""
    if msg.tool_calls:
        text += json.dumps(msg.tool_calls, sort_keys=True, ensure_ascii=False, default=str)
    return text


@dataclass(slots=True)
class Context:
    """What one generation shares across its parts: the text source, the renderer, and (when a
    workload is a component of another) a prefix for ids and a time offset for arrivals."""

    textgen: TextGen
    renderer: Renderer
    id_prefix: str = ""
    time_offset_s: float = 0.0

    @classmethod
    def for_params(cls, params: WorkloadParams) -> Context:
        textgen = TextGen(params.seed)
        return cls(textgen, Renderer(params.tokenizer, params.keep_text, textgen.counts))


def uniform_turns(low: int, high: int) -> Callable[[np.random.Generator, int], np.ndarray]:
    """Turn counts uniform on ``[low, high]``."""
    return lambda rng, k: rng.integers(low, high + 1, size=k)


def mixed_turns(
    single_fraction: float, low: int, high: int
) -> tuple[Callable[[np.random.Generator, int], np.ndarray], float]:
    """One turn with probability ``single_fraction``, else uniform on ``[low, high]``; returns
    the sampler and its mean."""

    def draw(rng: np.random.Generator, k: int) -> np.ndarray:
        multi = rng.integers(low, high + 1, size=k)
        return np.where(rng.random(k) < single_fraction, 1, multi)

    return draw, single_fraction + (1 - single_fraction) * (low + high) / 2
