"""KV-event decoding (map and positional encodings), the ZMQ subscriber and the per-replica
index, with an in-process PUB socket standing in for vLLM (no engine needed)."""

from __future__ import annotations

import time

import msgpack
import pytest

from skv.vllm.kv_events import (
    AllBlocksCleared,
    BlockRemoved,
    BlockStored,
    KVEventDecodeError,
    KVEventSubscriber,
    KVIndex,
    UnknownEvent,
    decode_batch,
    decode_events,
    encode_events,
)

zmq = pytest.importorskip("zmq")


def _map_payload():
    return msgpack.packb(
        [
            1234.5,
            [
                {
                    "type": "BlockStored",
                    "block_hashes": [11, 12],
                    "parent_block_hash": None,
                    "token_ids": list(range(64)),
                    "block_size": 32,
                    "lora_id": None,
                    "medium": "GPU",
                    "group_idx": 0,
                },
                {"type": "BlockRemoved", "block_hashes": [11], "medium": "GPU"},
                {"type": "AllBlocksCleared"},
            ],
            0,
        ],
        use_bin_type=True,
    )


def _positional_payload():
    return msgpack.packb(
        [
            1234.5,
            [
                ["BlockStored", [11, 12], None, list(range(64)), 32, None, "GPU"],
                ["BlockRemoved", [11], "GPU"],
                ["AllBlocksCleared"],
            ],
            0,
        ],
        use_bin_type=True,
    )


@pytest.mark.parametrize("payload", [_map_payload(), _positional_payload()], ids=["map", "array"])
def test_both_encodings_decode_to_the_same_events(payload):
    stored, removed, cleared = decode_events(payload)
    assert stored == BlockStored((11, 12), None, tuple(range(64)), 32, medium="GPU")
    assert stored.num_tokens == 64 and stored.type == "BlockStored"
    assert removed == BlockRemoved((11,), medium="GPU")
    assert isinstance(cleared, AllBlocksCleared)
    batch = decode_batch(payload, seq=7)
    assert batch.ts == 1234.5 and batch.dp_rank == 0 and batch.seq == 7


def test_map_events_keep_unknown_fields_and_bytes_hashes():
    h1, h2 = b"\x01" * 32, b"\x02" * 32
    payload = msgpack.packb(
        [
            0.0,
            [
                {
                    "type": "BlockStored",
                    "block_hashes": [h1, h2],
                    "parent_block_hash": b"\x00" * 32,
                    "token_ids": [5] * 64,
                    "block_size": 32,
                    "medium": None,
                    "group_idx": 3,
                },
                {"type": "SomethingNew", "x": 1},
            ],
        ],
        use_bin_type=True,
    )
    stored, other = decode_events(payload)
    assert stored.block_hashes == (h1, h2) and stored.parent_block_hash == b"\x00" * 32
    assert stored.extra == {"group_idx": 3}
    assert isinstance(other, UnknownEvent) and other.type == "SomethingNew"


def test_encode_round_trips_in_both_encodings():
    evs = [
        BlockStored((1, 2), 9, tuple(range(32)) * 2, 32, medium="GPU", lora_id=None),
        BlockRemoved((1,), medium="GPU"),
        AllBlocksCleared(),
    ]
    for positional in (False, True):
        assert decode_events(encode_events(evs, positional=positional)) == evs


def test_bad_payloads_raise_decode_errors():
    with pytest.raises(KVEventDecodeError):
        decode_events(b"\xc1")  # never-used msgpack byte
    with pytest.raises(KVEventDecodeError):
        decode_events(msgpack.packb(42))
    with pytest.raises(KVEventDecodeError):
        decode_events(msgpack.packb([0.0, [["BlockStored", [1]]]]))


def test_index_counts_stores_removals_and_clears():
    seen = []
    idx = KVIndex()
    idx.add_listener(lambda r, e: seen.append((r, e.type)))
    idx.apply("a", BlockStored((1, 2, 3), None, (), 32))
    idx.apply("b", BlockStored((1, 2), None, (), 32))
    idx.apply("a", BlockRemoved((3, 99)))
    assert idx.prefix_overlap("a", [1, 2, 3]) == 2
    assert idx.overlap([1, 2, 3]) == {"a": 2, "b": 2}
    assert idx.overlap([2, 1]) == {"a": 2, "b": 2}
    assert idx.overlap([7, 1]) == {"a": 0, "b": 0}  # a prefix hit stops at the first miss
    st = idx.state("a")
    assert (st.stores, st.stored_blocks, st.removals, st.removed_blocks) == (1, 3, 1, 2)
    assert st.unknown_removals == 1
    idx.apply("a", AllBlocksCleared())
    assert idx.num_blocks("a") == 0 and idx.state("a").clears == 1 and idx.num_blocks("b") == 2
    assert idx.best_replica([1, 2]) == ("b", 2)
    idx.clear()
    assert idx.num_blocks("b") == 0
    assert [t for _, t in seen] == [
        "BlockStored",
        "BlockStored",
        "BlockRemoved",
        "AllBlocksCleared",
    ]


def test_index_medium_filter():
    idx = KVIndex(medium="GPU")
    idx.apply(0, BlockStored((1,), None, (), 32, medium="CPU"))
    idx.apply(0, BlockStored((2,), None, (), 32, medium="GPU"))
    idx.apply(0, BlockStored((3,), None, (), 32))
    assert idx.state(0).blocks == {2, 3}


# ---------------------------------------------------------------------- over ZMQ


class Publisher:
    """vLLM's side: PUB bound on the endpoint, multipart [topic, seq, payload]."""

    def __init__(self, endpoint: str, topic: str = "kv") -> None:
        self.sock = zmq.Context.instance().socket(zmq.PUB)
        self.sock.setsockopt(zmq.LINGER, 0)
        self.sock.bind(endpoint)
        self.topic = topic
        self.seq = 0

    def send(self, events, *, positional=False, seq=None) -> None:
        if seq is not None:
            self.seq = seq
        payload = encode_events(events, positional=positional)
        self.sock.send_multipart([self.topic.encode(), self.seq.to_bytes(8, "big"), payload])
        self.seq += 1

    def close(self) -> None:
        self.sock.close(0)


def _connected(pub: Publisher, sub: KVEventSubscriber) -> None:
    """Send probes until the subscription has reached the publisher (slow joiner)."""
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        pub.send([AllBlocksCleared()])
        if sub.drain(0.1):
            return
    raise AssertionError("subscriber never connected")


def _until(sub: KVEventSubscriber, pred, timeout: float = 5.0) -> bool:
    deadline = time.monotonic() + timeout
    while not pred():
        if time.monotonic() > deadline:
            return False
        sub.drain(0.05)
    return True


@pytest.fixture
def endpoint(tmp_path):
    return f"ipc://{tmp_path}/kv.sock"


@pytest.mark.parametrize("threaded", [False, True], ids=["poll", "thread"])
def test_subscriber_feeds_the_index_and_detects_seq_gaps(endpoint, threaded):
    pub = Publisher(endpoint)
    idx = KVIndex()
    calls = []
    sub = KVEventSubscriber(
        endpoint, "kv", replica="r0", index=idx, on_event=lambda r, e: calls.append((r, e))
    )
    try:
        if threaded:
            sub.start()
        _connected(pub, sub)
        base = idx.state("r0").clears
        pub.send([BlockStored((1, 2), None, tuple(range(64)), 32, medium="GPU")])
        pub.send([BlockStored((3,), 2, tuple(range(32)), 32)], positional=True)
        pub.send([BlockRemoved((1,), medium="GPU")])
        assert _until(sub, lambda: idx.state("r0").removals == 1)
        st = idx.state("r0")
        assert st.blocks == {2, 3}
        assert (st.stores, st.stored_blocks, st.removals, st.removed_blocks) == (2, 3, 1, 1)
        assert idx.prefix_overlap("r0", [1, 2]) == 0 and idx.overlap([2, 3]) == {"r0": 2}
        assert sub.gaps == [] and sub.missed == 0

        pub.send([BlockStored((4,), None, (), 32)], seq=pub.seq + 5)  # 5 messages lost
        pub.send([AllBlocksCleared()])
        assert _until(sub, lambda: idx.state("r0").clears == base + 1)
        assert idx.num_blocks("r0") == 0 and idx.state("r0").clears == base + 1
        assert len(sub.gaps) == 1 and sub.missed == 5
        assert all(r == "r0" for r, _ in calls)
        assert sub.stats()["gaps"] == 1
    finally:
        sub.close()
        pub.close()


def test_subscriber_ignores_other_topics_and_bad_payloads(endpoint):
    pub = Publisher(endpoint, topic="kv")
    sub = KVEventSubscriber(endpoint, "kv")
    try:
        _connected(pub, sub)
        n0 = len(sub.events)
        pub.sock.send_multipart([b"kv", (pub.seq).to_bytes(8, "big"), b"\xc1"])
        pub.seq += 1
        pub.sock.send_multipart([b"zz", (pub.seq).to_bytes(8, "big"), encode_events([])])
        pub.send([BlockStored((9,), None, (), 32)])
        sub.drain(2, idle=0.3)
        assert sub.decode_errors == 1
        assert [e.type for e in list(sub.events)[n0:]] == ["BlockStored"]
    finally:
        sub.close()
        pub.close()
