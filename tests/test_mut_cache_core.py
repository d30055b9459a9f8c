"""Cases of the radix cache, its block records and vLLM's block pool (``skv/cache/radix.py``,
``block.py``, ``vllm_pool.py``) that the mutation run of 2026-12-01 showed unpinned: a new
block's initial state, ``repr`` and ``new_block``'s compiled fast path; a ghost entry's key;
eviction reasons matched exactly; policies that leave ``leaf_only``, ``name`` or
``uses_ghost_list`` undeclared; requests whose lists disagree or whose chain contradicts the
cached tree; the time ``on_extend`` gets; an evicted block's parent; a pool lease extended to a
shorter request; and a hash id cached full in one request and partial in another. Expected
values are worked by hand in each docstring; every test runs the same on the compiled build
and as plain Python (the mutation run's mode)."""

from __future__ import annotations

import cython
import pytest
from helpers import rb

from skv.blocks import RequestBlocks, request_blocks
from skv.cache import block as block_module
from skv.cache.block import Block, Counters, GhostEntry, GhostList, new_block
from skv.cache.radix import BlockCache
from skv.cache.vllm_pool import VllmBlockPool
from skv.model import TYPE_INDEX, Request, Segment, SemanticType
from skv.policies.lru import LRU

T = SemanticType
BS = 4


def keys_of(lease) -> list[int]:
    return [b.key for b in lease.blocks]


# ---------------------------------------------------------------- Block, GhostEntry, Counters


def test_a_new_block_is_unpinned_and_carries_no_policy_state():
    """``Block(...)`` (what ``new_block`` builds as plain Python, and what policies build as
    sentinels): no holder, no child, no reuse, version 0, no next use, and no policy data, list
    links or heap key until a policy writes them."""
    parent = Block(1, None, BS, 0, 0, None, 0.0)
    b = Block(2, parent, 3, TYPE_INDEX[T.SYSTEM], 1, None, 5.0)
    assert (b.key, b.parent, b.tokens, b.stype, b.pos) == (2, parent, 3, TYPE_INDEX[T.SYSTEM], 1)
    assert (b.inserted_at, b.last_access) == (5.0, 5.0)
    assert (b.ref, b.n_children, b.hits, b.version, b.next_use) == (0, 0, 0, 0, 0)
    assert b.pdata is None and b.link_prev is None and b.link_next is None
    assert (b.pk1, b.pk2, b.pseq) == (0.0, 0.0, 0)
    assert all(type(v) is float for v in (b.pk1, b.pk2))


def test_a_blocks_repr_shows_an_int_key_in_hex_and_any_other_key_as_its_repr():
    """Radix keys are ints (shown in hex); vLLM's block hashes are bytes (shown by repr)."""
    b = Block(255, None, BS, TYPE_INDEX[T.TOOL_SCHEMA], 3, None, 0.0)
    assert repr(b) == f"Block(key=0xff, stype={TYPE_INDEX[T.TOOL_SCHEMA]}, pos=3, ref=0)"
    b = Block(b"\x01h", None, BS, 0, 0, None, 0.0)
    b.ref = 2
    assert repr(b) == "Block(key=b'\\x01h', stype=0, pos=0, ref=2)"


class _CompiledShadow:
    """Cython's pure-Python shadow module with ``compiled`` set: ``new_block`` takes its
    compiled branch (``Block.__new__`` and the fields set one by one) even as plain Python."""

    compiled = True

    def __getattr__(self, name: str):
        return getattr(cython, name)


@pytest.fixture
def compiled_new_block(monkeypatch):
    """``new_block`` through the branch the compiled build runs: compiled, it is what runs
    anyway; as plain Python the module is made to take that branch, so it is tested in both
    modes (a mutation run cannot mutate the compiled build)."""
    if block_module.__file__.endswith(".py"):
        monkeypatch.setattr(block_module, "cython", _CompiledShadow())


def test_new_blocks_fast_path_gives_a_block_holding_what_it_was_given(compiled_new_block):
    """Key, parent, tokens, type, position, inserting request and both times (inserted and
    last used at ``now``)."""
    parent = Block(1, None, BS, 0, 0, None, 0.0)
    req = rb([1, 2])
    b = new_block(2, parent, 3, TYPE_INDEX[T.RETRIEVED_CONTEXT], 1, req, 7.5)
    assert isinstance(b, Block)
    assert (b.key, b.parent, b.req) == (2, parent, req)
    assert (b.tokens, b.stype, b.pos) == (3, TYPE_INDEX[T.RETRIEVED_CONTEXT], 1)
    assert (b.inserted_at, b.last_access) == (7.5, 7.5)


def test_a_ghost_entry_has_no_key_until_a_ghost_list_stores_it():
    """vLLM's pool builds its ghost records by hand: one stored under key 9 gets key 9."""
    entry = GhostEntry(TYPE_INDEX[T.SYSTEM], 6.0, 0, BS, 0)
    assert entry.key is None
    ghosts = GhostList(2)
    ghosts.add(9, entry)
    assert entry.key == 9 and ghosts.pop(9) is entry


def test_an_eviction_reason_is_matched_exactly():
    """Only the reason ``"capacity"`` itself is the remainder: ``"CAPACITY"`` is a reason of
    its own. One of each: {"CAPACITY": 1, "capacity": 1}."""
    c = Counters()
    c.eviction(0, "CAPACITY")
    c.eviction(0, "capacity")
    s = c.snapshot()
    assert s.evictions == 2
    assert s.evictions_by_reason == {"CAPACITY": 1, "capacity": 1}


# ---------------------------------------------------------------- BlockCache: the policy's flags


def _undeclared(attr: str) -> property:
    """A class attribute whose lookup fails, as on a policy that never declared it (a duck-typed
    policy as plain Python; a ``Policy`` subclass here, so that the compiled cache takes it)."""

    def get(self):
        raise AttributeError(attr)

    return property(get)


class NoLeafFlag(LRU):
    leaf_only = _undeclared("leaf_only")


class NoGhostFlag(LRU):
    uses_ghost_list = _undeclared("uses_ghost_list")


class NamelessAnywhere(LRU):
    leaf_only = False
    name = _undeclared("name")


def test_a_policy_that_does_not_say_whether_it_is_leaf_only_is_taken_as_one():
    """Accepted, and it serves requests: [1, 2] then [1, 3] hits 1."""
    cache = BlockCache(4, NoLeafFlag())
    cache.access(rb([1, 2]), 0.0)
    assert cache.access(rb([1, 3]), 1.0).hit_blocks == 1


def test_a_policy_that_does_not_say_it_learns_from_ghosts_gets_no_ghost_list():
    """No flag: no ghost list (capacity 0, nothing remembered on eviction); a policy that sets
    the flag gets one as large as the cache."""
    cache = BlockCache(1, NoGhostFlag())
    assert cache.ghost.capacity == 0
    cache.access(rb([1]), 0.0)
    cache.access(rb([2]), 1.0)
    assert len(cache.ghost) == 0

    class Learns(LRU):
        uses_ghost_list = True

    assert BlockCache(3, Learns()).ghost.capacity == 3


def test_a_policy_pool_for_a_policy_that_does_not_say_it_learns_from_ghosts_has_no_ghosts():
    """The vLLM pool ordered by a policy reads the same flag (its ghost list is the free
    order's): none without it, one as large as the pool with it."""
    from skv.cache.policy_pool import PolicyBlockPool

    assert PolicyBlockPool(3, NoGhostFlag()).ghost.capacity == 0

    class Learns(LRU):
        uses_ghost_list = True

    assert PolicyBlockPool(3, Learns()).ghost.capacity == 3


def test_a_nameless_policy_that_is_not_leaf_only_is_named_by_its_class():
    with pytest.raises(
        ValueError, match=r"^policy 'NamelessAnywhere' is not leaf-only; BlockCache needs one$"
    ):
        BlockCache(4, NamelessAnywhere())


# ---------------------------------------------------------------- BlockCache: malformed requests


def _mismatched() -> RequestBlocks:
    """Two blocks but one parent."""
    return RequestBlocks(
        index=0,
        arrival_s=0.0,
        keys=[1, 2],
        parents=[None],
        tokens=[BS, BS],
        stypes=[0, 0],
        seg_tokens=[BS, BS],
        session=None,
        turn=0,
        templated=False,
        block_size=BS,
    )


def test_lookup_and_admission_need_refuse_a_request_whose_keys_and_parents_disagree():
    """``RequestBlocks`` does not check its lists: a request with two keys and one parent is
    refused here, not cut to one block (its first block is cached)."""
    cache = BlockCache(4, LRU())
    cache.access(rb([1, 2]), 0.0)
    with pytest.raises(ValueError):
        cache.lookup(_mismatched())
    with pytest.raises(ValueError):
        cache.admission_need(_mismatched())


def test_acquire_refuses_a_cached_first_block_that_is_not_a_chain_root():
    """[2] is cached as a chain root; a request whose first block 2 claims parent 1 (which it
    does not hold) cannot reach it: the broken chain is reported with the block's key."""
    cache = BlockCache(8, LRU())
    cache.access(rb([2]), 0.0)
    with pytest.raises(AssertionError, match=r"^block 0x2 cached without its parent chain$"):
        cache.acquire(rb([2], parents=[1]), 1.0)


def test_acquire_refuses_a_cached_block_reached_after_a_miss():
    """[1, 2, 3] is cached. A request [1, 9, 3] whose 3 continues 9: 1 hits, 9 misses (the run
    ends there), so the cached 3 (a child of 2) is not on its chain: refused, with 3's key."""
    cache = BlockCache(8, LRU())
    cache.access(rb([1, 2, 3]), 0.0)
    with pytest.raises(AssertionError, match=r"^block 0x3 cached without its parent chain$"):
        cache.acquire(rb([1, 9, 3], parents=[None, 1, 9]), 1.0)


# ---------------------------------------------------------------- BlockCache: extend, eviction


class ExtendRecorder(LRU):
    def __init__(self) -> None:
        super().__init__()
        self.extends: list[tuple[list, float]] = []

    def on_extend(self, rb, now):
        self.extends.append((list(rb.keys), now))


def test_extend_tells_the_policy_the_time_the_request_grows():
    """[1] acquired at 0, grown to [1, 2] at 2.5: the policy hears of the extension at 2.5."""
    pol = ExtendRecorder()
    cache = BlockCache(4, pol)
    lease = cache.acquire(rb([1]), 0.0)
    cache.extend(lease, rb([1, 2]), 1, 2.5)
    assert pol.extends == [([1, 2], 2.5)]
    assert keys_of(lease) == [1, 2]


def test_an_evicted_block_lets_go_of_its_parent():
    """Capacity 2: [1, 2] is accessed (its lease keeps the block objects), then [3] evicts the
    LRU leaf 2: the evicted block no longer points at 1 (parent None, as a chain root's), and 1
    has no child left."""
    cache = BlockCache(2, LRU())
    lease = cache.access(rb([1, 2]), 0.0)
    one, two = lease.blocks
    assert two.parent is one
    cache.access(rb([3]), 1.0)
    assert 2 not in cache.blocks
    assert two.parent is None
    assert one.n_children == 0


# ---------------------------------------------------------------- VllmBlockPool


def test_the_pool_does_nothing_when_a_lease_is_extended_to_a_shorter_request():
    """Prompt [1, 2 (partial: 2 tokens)] in flight; "extended" to [1] from block 1 on: there
    is nothing to grow (as in ``BlockCache.extend``): the lease, the hashes and the free queue
    stay as they were."""
    pool = VllmBlockPool(4)
    lease = pool.acquire(rb([1, 2], tokens=[BS, 2], block_size=BS), 0.0)
    held, free = list(lease.blocks), pool.free
    pool.extend(lease, rb([1], block_size=BS), 1, 1.0)
    assert lease.blocks == held and pool.free == free
    assert pool.hash[held[1]] is None and sorted(pool.cached) == [1]


def _hash_id_request(prompt_tokens: int) -> RequestBlocks:
    """One block of hash id 7 (block size 4) holding ``prompt_tokens`` tokens."""
    r = Request(
        request_id=f"r{prompt_tokens}",
        arrival_s=0.0,
        segments=[Segment(T.UNKNOWN, prompt_tokens)],
        hash_ids=[7],
        hash_block_size=BS,
    )
    return request_blocks(r, BS)


def test_a_partial_block_with_an_evicted_hash_id_leaves_its_ghost_alone():
    """A hash-id trace keys a block by its ids, not its fill: hash id 7 is a full block in one
    request and a partial one (2 tokens) in another, under the same key. Pool of 2 (1 usable),
    ghost list of 4: full 7, then [8] evicts it (ghost). The partial 7 is computed (never
    hashed, so 7 is not cached again) and keeps the ghost; the full 7 afterwards is a ghost
    hit."""
    full, partial = _hash_id_request(BS), _hash_id_request(2)
    key = full.keys[0]
    assert partial.keys == [key] and (full.tokens, partial.tokens) == ([BS], [2])
    pool = VllmBlockPool(2, ghost_capacity=4)
    pool.access(full, 0.0)
    pool.access(rb([8], block_size=BS), 1.0)
    assert key in pool.ghost
    pool.access(partial, 2.0)
    assert key in pool.ghost and key not in pool.cached
    assert pool.stats.ghost_hits == 0
    pool.access(full, 3.0)
    assert pool.stats.ghost_hits == 1 and key not in pool.ghost
