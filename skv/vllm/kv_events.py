"""vLLM KV-cache events: decode them, subscribe to them over ZMQ, index what each replica holds.

vLLM (``--kv-events-config '{"enable_kv_cache_events":true,"publisher":"zmq",...}'``) publishes
on a ZMQ PUB socket. Each message is multipart ``[topic, seq, payload]``: ``seq`` an 8-byte
big-endian counter, ``payload`` a msgpack array ``[ts, [events...], dp_rank]``. An event is
either a msgpack MAP tagged with ``"type"`` (recent vLLM: ``BlockStored`` with ``block_hashes``,
``parent_block_hash``, ``token_ids``, ``block_size``, ``lora_id``, ``medium``...;
``BlockRemoved`` with ``block_hashes``, ``medium``; ``AllBlocksCleared``) or, in older versions,
a positional array ``["BlockStored", hashes, parent, token_ids, block_size, lora_id, medium]``,
``["BlockRemoved", hashes, medium]``, ``["AllBlocksCleared"]``. :func:`decode_events` accepts both.

An ``ipc://`` (or ``tcp://*``) endpoint is bound by the publisher, so :class:`KVEventSubscriber`
connects. Events sent before the subscription reaches the publisher are lost, and the first
message seen opens the sequence; a later jump in ``seq`` is recorded as a gap.

:class:`KVIndex` keeps, per replica, the block hashes an engine reports as stored, with
counters, and answers prefix-overlap queries (how many leading blocks of a request a replica
holds): the state a cache-aware router needs. Queries come in two kinds:

* by engine hash (:meth:`KVIndex.prefix_overlap`), for a caller that knows the engine's hashes;
* by TOKEN IDS (:meth:`KVIndex.token_overlap`), for a router that only sees prompts. vLLM's block
  hash (sha256 of parent hash, tokens and extra keys, seeded per process) cannot be recomputed
  outside the engine, so the index re-keys every stored block by *content*: ``key_i =
  hash((key_{i-1}, tokens of block i))``, chained through ``parent_block_hash`` exactly as the
  engine chains its hashes. A router tokenizes a prompt (the engine's ``/tokenize``), chains the
  same keys over its full blocks and counts the leading ones a replica holds. Content keys ignore
  the engine's extra keys (LoRA, multimodal inputs, ``cache_salt``): they assume one base model
  and unsalted prompts. A block whose parent the index never saw (stored before the subscription)
  cannot be chained and is counted in ``unchained_blocks``.

Anything can listen to the decoded events (``on_event`` callbacks), so a router can keep its own
state too.

    index = KVIndex()
    with KVEventSubscriber(srv.kv_events_endpoint, topic="kv-events", replica="r0",
                           index=index) as sub:
        sub.start()            # background thread; or call sub.drain(timeout) yourself
        ...
        index.prefix_overlap("r0", hashes)
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from collections.abc import Callable, Hashable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

import msgpack

log = logging.getLogger(__name__)

#: a block hash as published: an int (older vLLM, 64-bit) or bytes (sha256-based hashing)
BlockHash = Hashable


# ---------------------------------------------------------------------- events


@dataclass(frozen=True, slots=True)
class BlockStored:
    """Blocks newly stored (now hittable) on an engine; ``token_ids`` holds every block's tokens
    in order (``len(token_ids) == len(block_hashes) * block_size`` for full blocks)."""

    block_hashes: tuple[BlockHash, ...]
    parent_block_hash: BlockHash | None
    token_ids: tuple[int, ...]
    block_size: int
    medium: str | None = None
    lora_id: int | None = None
    extra: dict[str, Any] = field(default_factory=dict, compare=False)

    @property
    def num_tokens(self) -> int:
        return len(self.token_ids)

    @property
    def type(self) -> str:
        return "BlockStored"


@dataclass(frozen=True, slots=True)
class BlockRemoved:
    """Blocks evicted from an engine's cache."""

    block_hashes: tuple[BlockHash, ...]
    medium: str | None = None
    extra: dict[str, Any] = field(default_factory=dict, compare=False)

    @property
    def type(self) -> str:
        return "BlockRemoved"


@dataclass(frozen=True, slots=True)
class AllBlocksCleared:
    """The engine dropped its whole prefix cache (``reset_prefix_cache``)."""

    medium: str | None = None

    @property
    def type(self) -> str:
        return "AllBlocksCleared"


@dataclass(frozen=True, slots=True)
class UnknownEvent:
    """An event of a type this module does not know; kept so a caller can see it."""

    event_type: str
    raw: Any = field(compare=False, default=None)

    @property
    def type(self) -> str:
        return self.event_type


KVEvent = BlockStored | BlockRemoved | AllBlocksCleared | UnknownEvent


@dataclass(frozen=True, slots=True)
class EventBatch:
    """One published message: its ``seq``, timestamp, data-parallel rank and events."""

    seq: int | None
    ts: float | None
    events: tuple[KVEvent, ...]
    dp_rank: int | None = None
    topic: str = ""


class KVEventDecodeError(ValueError):
    """A payload or event that is not a vLLM KV event."""


def _hash(h: Any) -> BlockHash:
    if isinstance(h, list):  # msgpack arrays decode to lists; a hash must be hashable
        return tuple(_hash(x) for x in h)
    if isinstance(h, bytearray):
        return bytes(h)
    return h


def _hashes(hs: Any) -> tuple[BlockHash, ...]:
    if hs is None:
        return ()
    if not isinstance(hs, (list, tuple)):
        raise KVEventDecodeError(f"block_hashes is {type(hs).__name__}, expected an array")
    return tuple(_hash(h) for h in hs)


def _type_name(t: Any) -> str:
    return t.decode() if isinstance(t, bytes) else str(t)


_STORED_KEYS = {"type", "block_hashes", "parent_block_hash", "token_ids", "block_size"}
_STORED_KEYS |= {"medium", "lora_id"}


def decode_event(raw: Any) -> KVEvent:
    """One event, map-encoded (``{"type": ...}``) or positional (``["BlockStored", ...]``)."""
    if isinstance(raw, dict):
        raw = {_type_name(k): v for k, v in raw.items()}
        kind = _type_name(raw.get("type", ""))
        if kind == "BlockStored":
            return BlockStored(
                block_hashes=_hashes(raw.get("block_hashes")),
                parent_block_hash=_hash(raw.get("parent_block_hash")),
                token_ids=tuple(raw.get("token_ids") or ()),
                block_size=int(raw.get("block_size") or 0),
                medium=raw.get("medium"),
                lora_id=raw.get("lora_id"),
                extra={k: v for k, v in raw.items() if k not in _STORED_KEYS},
            )
        if kind == "BlockRemoved":
            return BlockRemoved(
                block_hashes=_hashes(raw.get("block_hashes")),
                medium=raw.get("medium"),
                extra={k: v for k, v in raw.items() if k not in ("type", "block_hashes", "medium")},
            )
        if kind == "AllBlocksCleared":
            return AllBlocksCleared(medium=raw.get("medium"))
        return UnknownEvent(kind, raw)
    if isinstance(raw, (list, tuple)) and raw:
        kind = _type_name(raw[0])
        f = list(raw[1:])
        if kind == "BlockStored":
            if len(f) < 4:
                raise KVEventDecodeError(f"positional BlockStored with {len(f)} fields, need 4+")
            return BlockStored(
                block_hashes=_hashes(f[0]),
                parent_block_hash=_hash(f[1]),
                token_ids=tuple(f[2] or ()),
                block_size=int(f[3] or 0),
                lora_id=f[4] if len(f) > 4 else None,
                medium=f[5] if len(f) > 5 else None,
                extra={"fields": f[6:]} if len(f) > 6 else {},
            )
        if kind == "BlockRemoved":
            if not f:
                raise KVEventDecodeError("positional BlockRemoved without block_hashes")
            return BlockRemoved(block_hashes=_hashes(f[0]), medium=f[1] if len(f) > 1 else None)
        if kind == "AllBlocksCleared":
            return AllBlocksCleared(medium=f[0] if f and isinstance(f[0], str) else None)
        return UnknownEvent(kind, raw)
    raise KVEventDecodeError(f"not a KV event: {raw!r:.200}")


def decode_batch(payload: bytes, *, seq: int | None = None, topic: str = "") -> EventBatch:
    """A whole payload ``[ts, [events...], dp_rank]`` (a map ``{"ts", "events", ...}`` too)."""
    try:
        obj = msgpack.unpackb(payload, raw=False, strict_map_key=False)
    except Exception as exc:  # msgpack raises several unrelated types
        raise KVEventDecodeError(f"payload is not msgpack: {exc}") from exc
    if isinstance(obj, dict):
        ts, events, dp = obj.get("ts"), obj.get("events"), obj.get("data_parallel_rank")
    elif isinstance(obj, (list, tuple)) and len(obj) >= 2:
        ts, events = obj[0], obj[1]
        dp = obj[2] if len(obj) > 2 else None
    else:
        raise KVEventDecodeError(f"payload is not [ts, events, dp_rank]: {obj!r:.200}")
    if not isinstance(events, (list, tuple)):
        raise KVEventDecodeError(f"events is {type(events).__name__}, expected an array")
    return EventBatch(
        seq=seq,
        ts=float(ts) if ts is not None else None,
        events=tuple(decode_event(e) for e in events),
        dp_rank=dp,
        topic=topic,
    )


def decode_events(payload: bytes) -> list[KVEvent]:
    """The events of one msgpack payload, either encoding."""
    return list(decode_batch(payload).events)


def encode_events(
    events: Sequence[KVEvent],
    *,
    ts: float | None = None,
    dp_rank: int | None = 0,
    positional: bool = False,
) -> bytes:
    """The inverse of :func:`decode_events` (for tests and fake publishers)."""

    def enc(ev: KVEvent) -> Any:
        if isinstance(ev, BlockStored):
            if positional:
                return [
                    "BlockStored",
                    list(ev.block_hashes),
                    ev.parent_block_hash,
                    list(ev.token_ids),
                    ev.block_size,
                    ev.lora_id,
                    ev.medium,
                ]
            return {
                "type": "BlockStored",
                "block_hashes": list(ev.block_hashes),
                "parent_block_hash": ev.parent_block_hash,
                "token_ids": list(ev.token_ids),
                "block_size": ev.block_size,
                "lora_id": ev.lora_id,
                "medium": ev.medium,
            }
        if isinstance(ev, BlockRemoved):
            if positional:
                return ["BlockRemoved", list(ev.block_hashes), ev.medium]
            return {
                "type": "BlockRemoved",
                "block_hashes": list(ev.block_hashes),
                "medium": ev.medium,
            }
        if isinstance(ev, AllBlocksCleared):
            return ["AllBlocksCleared"] if positional else {"type": "AllBlocksCleared"}
        raise TypeError(f"cannot encode {type(ev).__name__}")

    body = [time.time() if ts is None else ts, [enc(e) for e in events], dp_rank]
    return msgpack.packb(body, use_bin_type=True)


# ---------------------------------------------------------------------- index


#: the content key a prompt's first block chains from
ROOT_KEY = 0


def content_keys(token_ids: Sequence[int], block_size: int, parent: int = ROOT_KEY) -> list[int]:
    """Chained content keys of the FULL blocks of ``token_ids`` (a trailing partial block has
    none: engines cache full blocks only). Equal keys mean equal token prefixes, up to 64-bit
    collisions; Python hashes ints and tuples the same in every process."""
    keys: list[int] = []
    k = parent
    for i in range(0, len(token_ids) - block_size + 1, block_size):
        k = hash((k, tuple(token_ids[i : i + block_size])))
        keys.append(k)
    return keys


@dataclass
class ReplicaState:
    """What one replica reports: stored hashes (each with its content key) and counters."""

    blocks: dict[BlockHash, int | None] = field(default_factory=dict)  # hash -> content key
    copies: dict[BlockHash, int] = field(default_factory=dict)  # hashes held by > 1 block
    content: dict[int, int] = field(default_factory=dict)  # content key -> blocks holding it
    block_size: int | None = None  # as the first event reports it
    stores: int = 0  # BlockStored events
    stored_blocks: int = 0  # hashes those events carried
    unchained_blocks: int = 0  # stored blocks without a content key (parent or tokens unknown)
    removals: int = 0  # BlockRemoved events
    removed_blocks: int = 0
    unknown_removals: int = 0  # removed hashes the index did not hold
    clears: int = 0

    def stats(self) -> dict[str, int]:
        return {
            "blocks": len(self.blocks),
            "stores": self.stores,
            "stored_blocks": self.stored_blocks,
            "unchained_blocks": self.unchained_blocks,
            "removals": self.removals,
            "removed_blocks": self.removed_blocks,
            "unknown_removals": self.unknown_removals,
            "clears": self.clears,
        }

    def store(self, ev: BlockStored) -> None:
        self.stores += 1
        self.stored_blocks += len(ev.block_hashes)
        if self.block_size is None and ev.block_size:
            self.block_size = ev.block_size
        keys: list[int | None] = []
        parent = ROOT_KEY if ev.parent_block_hash is None else self.blocks.get(ev.parent_block_hash)
        # content keys chain at one block size: an event of another size (vLLM's partial-block
        # events under hybrid KV layouts) is kept by hash only
        if parent is not None and ev.block_size and ev.block_size == self.block_size:
            keys = list(content_keys(ev.token_ids, ev.block_size, parent))
        if len(keys) != len(ev.block_hashes):  # parent unknown, or tokens missing or partial
            keys = [None] * len(ev.block_hashes)
            self.unchained_blocks += len(ev.block_hashes)
        for h, k in zip(ev.block_hashes, keys, strict=True):
            if h in self.blocks:  # another physical copy of a cached hash (vLLM keeps both)
                self.copies[h] = self.copies.get(h, 1) + 1
                continue
            self.blocks[h] = k
            if k is not None:
                self.content[k] = self.content.get(k, 0) + 1

    def remove(self, ev: BlockRemoved) -> None:
        self.removals += 1
        self.removed_blocks += len(ev.block_hashes)
        for h in ev.block_hashes:
            if h not in self.blocks:
                self.unknown_removals += 1
            elif self.copies.get(h, 1) > 1:  # one copy goes, the hash stays cached
                n = self.copies[h] - 1
                if n > 1:
                    self.copies[h] = n
                else:
                    del self.copies[h]
            else:
                self._drop(h)

    def _drop(self, h: BlockHash) -> None:
        k = self.blocks.pop(h, None)
        if k is not None:
            n = self.content[k] - 1
            if n:
                self.content[k] = n
            else:
                del self.content[k]

    def clear(self) -> None:
        self.blocks.clear()
        self.copies.clear()
        self.content.clear()


EventCallback = Callable[[Hashable, KVEvent], None]


class KVIndex:
    """Per-replica cached blocks, fed by KV events; thread-safe.

    ``medium`` (e.g. ``"GPU"``) ignores events that name another medium (events without one
    always count). ``block_size`` is the token-block size for :meth:`token_overlap` until a
    replica's events report theirs. ``on_event`` callbacks run after each applied event with
    (replica, event).
    """

    def __init__(self, *, medium: str | None = None, block_size: int | None = None) -> None:
        self.medium = medium
        self.block_size = block_size
        self.replicas: dict[Hashable, ReplicaState] = {}
        self._listeners: list[EventCallback] = []
        self._lock = threading.Lock()

    def add_listener(self, fn: EventCallback) -> None:
        self._listeners.append(fn)

    def state(self, replica: Hashable) -> ReplicaState:
        with self._lock:
            return self.replicas.setdefault(replica, ReplicaState())

    def apply(self, replica: Hashable, event: KVEvent) -> None:
        """Update ``replica``'s state with one event."""
        medium = getattr(event, "medium", None)
        if self.medium is not None and medium is not None and medium != self.medium:
            return
        with self._lock:
            st = self.replicas.setdefault(replica, ReplicaState())
            if isinstance(event, BlockStored):
                st.store(event)
            elif isinstance(event, BlockRemoved):
                st.remove(event)
            elif isinstance(event, AllBlocksCleared):
                st.clears += 1
                st.clear()
        for fn in self._listeners:
            fn(replica, event)

    def apply_all(self, replica: Hashable, events: Iterable[KVEvent]) -> None:
        for ev in events:
            self.apply(replica, ev)

    def clear(self, replica: Hashable | None = None) -> None:
        """Forget the blocks of one replica (all replicas with None); counters stay."""
        with self._lock:
            for r, st in self.replicas.items():
                if replica is None or r == replica:
                    st.clear()

    def contains(self, replica: Hashable, block_hash: BlockHash) -> bool:
        st = self.replicas.get(replica)
        return st is not None and block_hash in st.blocks

    def prefix_overlap(self, replica: Hashable, hashes: Sequence[BlockHash]) -> int:
        """How many LEADING blocks of ``hashes`` the replica holds (a prefix hit stops at the
        first miss, as in vLLM)."""
        st = self.replicas.get(replica)
        if st is None:
            return 0
        with self._lock:
            n = 0
            for h in hashes:
                if h not in st.blocks:
                    break
                n += 1
            return n

    def overlap(self, hashes: Sequence[BlockHash]) -> dict[Hashable, int]:
        """Leading-block overlap of ``hashes`` on every known replica."""
        return {r: self.prefix_overlap(r, hashes) for r in list(self.replicas)}

    def best_replica(self, hashes: Sequence[BlockHash]) -> tuple[Hashable | None, int]:
        """The replica with the longest prefix overlap (first such in insertion order)."""
        best, n = None, -1
        for r, k in self.overlap(hashes).items():
            if k > n:
                best, n = r, k
        return best, max(n, 0)

    def num_blocks(self, replica: Hashable) -> int:
        st = self.replicas.get(replica)
        return len(st.blocks) if st else 0

    def token_overlap(self, replica: Hashable, token_ids: Sequence[int]) -> int:
        """How many leading FULL blocks of the prompt ``token_ids`` the replica holds, matched by
        content (see the module doc)."""
        return self.token_overlaps(token_ids).get(replica, 0)

    def token_overlaps(self, token_ids: Sequence[int]) -> dict[Hashable, int]:
        """Leading-block content overlap of the prompt ``token_ids`` on every known replica."""
        keys_by_size: dict[int, list[int]] = {}
        out: dict[Hashable, int] = {}
        with self._lock:
            for r, st in self.replicas.items():
                bs = st.block_size or self.block_size
                if not bs:
                    out[r] = 0
                    continue
                keys = keys_by_size.get(bs)
                if keys is None:
                    keys = keys_by_size[bs] = content_keys(token_ids, bs)
                n = 0
                for k in keys:
                    if k not in st.content:
                        break
                    n += 1
                out[r] = n
        return out

    def replica_block_size(self, replica: Hashable) -> int | None:
        st = self.replicas.get(replica)
        return (st.block_size if st else None) or self.block_size

    def stats(self) -> dict[Hashable, dict[str, int]]:
        with self._lock:
            return {r: st.stats() for r, st in self.replicas.items()}


# ---------------------------------------------------------------------- subscriber


class KVEventSubscriber:
    """A ZMQ SUB socket on one engine's KV-event publisher.

    Connects to ``endpoint`` (the engine binds ``ipc://`` and ``tcp://*``; pass ``bind=True``
    when the engine was told a concrete tcp host and connects instead). Either call
    :meth:`drain` from your own loop, or :meth:`start` a background thread that receives
    continuously; then the socket belongs to that thread and :meth:`drain` only waits.

    Every decoded event goes to ``index`` (if given), to each ``on_event(replica, event)``
    callback, and to ``self.events`` (the last ``keep`` of them). Sequence numbers are checked:
    ``gaps`` lists ``(last_seq, seq)`` pairs where messages were lost, ``missed`` counts them.
    """

    def __init__(
        self,
        endpoint: str,
        topic: str = "kv",
        *,
        replica: Hashable = 0,
        index: KVIndex | None = None,
        on_event: EventCallback | Sequence[EventCallback] | None = None,
        bind: bool = False,
        keep: int = 100_000,
        context: Any = None,
    ) -> None:
        import zmq

        self.endpoint = endpoint
        self.topic = topic
        self.replica = replica
        self.index = index
        if on_event is None:
            self.callbacks: list[EventCallback] = []
        elif callable(on_event):
            self.callbacks = [on_event]
        else:
            self.callbacks = list(on_event)
        self.events: deque[KVEvent] = deque(maxlen=keep)
        self.batches = 0
        self.received = 0  # events decoded so far
        self.decode_errors = 0
        self.last_seq: int | None = None
        self.gaps: list[tuple[int, int]] = []
        self.missed = 0
        self._zmq = zmq
        self._ctx = context or zmq.Context.instance()
        self._sock = self._ctx.socket(zmq.SUB)
        self._sock.setsockopt(zmq.LINGER, 0)
        self._sock.setsockopt(zmq.SUBSCRIBE, topic.encode())
        if bind:
            self._sock.bind(endpoint)
        else:
            self._sock.connect(endpoint)
        self._cond = threading.Condition()
        self._thread: threading.Thread | None = None
        self._stop = threading.Event()
        self._closed = False

    # -- receiving

    def _handle(self, frames: list[bytes]) -> int:
        if len(frames) == 3:
            topic_b, seq_b, payload = frames
        elif len(frames) == 2:  # a publisher without sequence numbers
            topic_b, payload = frames
            seq_b = b""
        else:
            self.decode_errors += 1
            log.warning("KV event message with %d frames ignored", len(frames))
            return 0
        seq = int.from_bytes(seq_b, "big") if seq_b else None
        try:
            batch = decode_batch(payload, seq=seq, topic=topic_b.decode(errors="replace"))
        except KVEventDecodeError as exc:
            self.decode_errors += 1
            log.warning("undecodable KV event payload: %s", exc)
            return 0
        if seq is not None:
            if self.last_seq is not None and seq != self.last_seq + 1:
                self.gaps.append((self.last_seq, seq))
                if seq > self.last_seq:
                    self.missed += seq - self.last_seq - 1
            self.last_seq = seq
        for ev in batch.events:
            if self.index is not None:
                self.index.apply(self.replica, ev)
            for fn in self.callbacks:
                fn(self.replica, ev)
        with self._cond:
            self.batches += 1
            self.received += len(batch.events)
            self.events.extend(batch.events)
            self._cond.notify_all()
        return len(batch.events)

    def _receive(self, timeout: float) -> int:
        """Wait up to ``timeout`` s for a message, then take all that are queued."""
        n = 0
        if not self._sock.poll(int(max(timeout, 0) * 1000)):
            return 0
        while True:
            try:
                frames = self._sock.recv_multipart(self._zmq.NOBLOCK)
            except self._zmq.Again:
                return n
            n += self._handle(frames)

    def drain(self, timeout: float = 0.0, *, idle: float | None = None) -> int:
        """Receive (or, with a background thread, wait for) events for up to ``timeout`` s;
        return how many arrived. ``idle``: stop early once nothing arrived for that long."""
        deadline = time.monotonic() + timeout
        got = 0
        last = time.monotonic()
        while True:
            now = time.monotonic()
            left = deadline - now
            if idle is not None and now - last >= idle and got:
                return got
            if self._thread is not None:
                step = min(max(left, 0), 0.05)
                with self._cond:
                    before = self.received
                    self._cond.wait(step)
                    n = self.received - before
            else:
                n = self._receive(min(max(left, 0), 0.05))
            if n:
                got += n
                last = time.monotonic()
            if left <= 0:
                return got

    def wait_for(self, pred: Callable[[KVEvent], bool], timeout: float = 20.0) -> list[KVEvent]:
        """Events (seen so far or arriving within ``timeout``) for which ``pred`` holds."""
        deadline = time.monotonic() + timeout
        while True:
            found = [e for e in list(self.events) if pred(e)]
            if found or time.monotonic() >= deadline:
                return found
            self.drain(min(0.1, max(deadline - time.monotonic(), 0)))

    # -- background thread

    def start(self) -> KVEventSubscriber:
        if self._thread is None:
            self._stop.clear()
            self._thread = threading.Thread(target=self._run, name="kv-events", daemon=True)
            self._thread.start()
        return self

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                self._receive(0.1)
            except self._zmq.ZMQError as exc:  # socket closed under us
                if not self._stop.is_set():
                    log.warning("KV event subscriber stopped: %s", exc)
                return

    def stop(self) -> None:
        if self._thread is not None:
            self._stop.set()
            self._thread.join(5)
            self._thread = None

    def close(self) -> None:
        if self._closed:
            return
        self.stop()
        self._sock.close(0)
        self._closed = True

    def __enter__(self) -> KVEventSubscriber:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def stats(self) -> dict[str, Any]:
        return {
            "batches": self.batches,
            "received": self.received,
            "events": len(self.events),
            "last_seq": self.last_seq,
            "gaps": len(self.gaps),
            "missed": self.missed,
            "decode_errors": self.decode_errors,
        }
