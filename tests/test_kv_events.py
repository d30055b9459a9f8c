"""KV-event decoding (map and positional encodings), the ZMQ subscriber and the per-replica
index, with an in-process PUB socket standing in for vLLM (no engine needed)."""

from __future__ import annotations

import time

import msgpack
import pytest
from helpers import KVPublisher

from skv.vllm.kv_events import (
    AllBlocksCleared,
    BlockRemoved,
    BlockStored,
    KVEventDecodeError,
    KVEventSubscriber,
    KVIndex,
    UnknownEvent,
    content_keys,
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
    assert set(idx.state(0).blocks) == {2, 3}


def _toks(n_blocks: int, seed: int, bs: int = 4) -> tuple[int, ...]:
    return tuple(seed * 1000 + i for i in range(n_blocks * bs))


def test_content_keys_chain_full_blocks_only():
    t = list(range(10))
    keys = content_keys(t, 4)
    assert len(keys) == 2  # 10 tokens = 2 full blocks + a partial one without a key
    assert keys == content_keys(t[:8], 4)
    assert content_keys([9, 9, 9, 9, *t[4:8]], 4)[1] != keys[1]  # a key depends on its prefix
    assert content_keys(t[4:8], 4, parent=keys[0]) == keys[1:]  # chaining = one long call


def test_token_overlap_matches_prompts_by_content_through_parent_hashes():
    idx = KVIndex()
    a = _toks(3, 1)
    # one request stored in two events (first two blocks, then the third under its parent)
    idx.apply("r0", BlockStored((b"h1", b"h2"), None, a[:8], 4))
    idx.apply("r0", BlockStored((b"h3",), b"h2", a[8:], 4))
    idx.apply("r1", BlockStored((b"x1",), None, a[:4], 4))  # other hashes, same content
    assert idx.token_overlaps([*a, 7, 7]) == {"r0": 3, "r1": 1}
    assert idx.token_overlap("r0", _toks(3, 2)) == 0
    other_tail = [*a[:8], 5, 5, 5, 5]
    assert idx.token_overlap("r0", other_tail) == 2
    idx.apply("r0", BlockRemoved((b"h2",)))  # a hole: the prefix match stops there
    assert idx.token_overlap("r0", a) == 1
    idx.apply("r0", AllBlocksCleared())
    assert idx.token_overlap("r0", a) == 0 and idx.state("r0").content == {}


def test_token_overlap_counts_shared_content_once_per_holder():
    idx = KVIndex()
    a = _toks(1, 3)
    idx.apply(0, BlockStored((1,), None, a, 4))
    idx.apply(0, BlockStored((2,), None, a, 4))  # same tokens under another hash (another salt)
    idx.apply(0, BlockRemoved((1,)))
    assert idx.token_overlap(0, a) == 1  # still held under hash 2
    idx.apply(0, BlockRemoved((2,)))
    assert idx.token_overlap(0, a) == 0


def test_a_hash_cached_twice_survives_the_eviction_of_one_copy():
    """vLLM keeps duplicate blocks per hash (a recomputed last block, two requests storing the
    same prefix in one step) and reports each copy's store and removal."""
    idx = KVIndex()
    a = _toks(2, 1)
    idx.apply(0, BlockStored((11, 22), None, a, 4))
    idx.apply(0, BlockStored((22,), 11, a[4:], 4))  # a second physical copy of block 22
    idx.apply(0, BlockRemoved((22,)))
    assert idx.token_overlap(0, a) == 2 and idx.prefix_overlap(0, [11, 22]) == 2
    idx.apply(0, BlockStored((33,), 22, _toks(1, 5), 4))  # a child still chains through 22
    assert idx.state(0).unchained_blocks == 0
    idx.apply(0, BlockRemoved((22,)))
    assert idx.token_overlap(0, a) == 1 and idx.num_blocks(0) == 2


def test_events_of_another_block_size_are_kept_by_hash_only():
    idx = KVIndex()
    idx.apply(0, BlockStored((1,), None, _toks(1, 1), 4))
    idx.apply(0, BlockStored((2,), 1, _toks(1, 2, bs=2)[:2], 2))  # a partial-block event
    st = idx.state(0)
    assert st.block_size == 4 and st.unchained_blocks == 1
    assert idx.token_overlap(0, _toks(1, 1)) == 1


def test_blocks_without_a_known_parent_are_unchained():
    idx = KVIndex()
    idx.apply(0, BlockStored((5,), 4, _toks(1, 1), 4))  # parent 4 stored before we listened
    idx.apply(0, BlockStored((6,), None, (), 4))  # no token ids in the event
    st = idx.state(0)
    assert st.unchained_blocks == 2 and len(st.blocks) == 2 and st.content == {}
    assert idx.prefix_overlap(0, [5]) == 1  # hash queries still work


def test_token_overlap_needs_a_block_size():
    idx = KVIndex()
    idx.state("r0")  # known replica, no events yet
    assert idx.token_overlaps(_toks(2, 1)) == {"r0": 0}
    assert KVIndex(block_size=4).replica_block_size("r0") == 4


# ---------------------------------------------------------------------- over ZMQ


def _connected(pub: KVPublisher, sub: KVEventSubscriber) -> None:
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
    pub = KVPublisher(endpoint)
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
        assert set(st.blocks) == {2, 3}
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
    pub = KVPublisher(endpoint, topic="kv")
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
