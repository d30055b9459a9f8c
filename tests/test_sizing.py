"""KV sizing: bytes per token of the model presets and capacity specs resolved to blocks."""

from __future__ import annotations

import pytest

from skv.sizing import MODELS, Capacity, get_model


def test_llama_3_1_8b_bf16_needs_131072_bytes_per_token():
    assert get_model("llama-3.1-8b").kv_bytes_per_token == 131_072


def test_llama_3_3_70b_fp8_needs_163840_bytes_per_token():
    assert get_model("llama-3.3-70b-fp8").kv_bytes_per_token == 163_840


def test_bytes_per_token_is_2_layers_kv_heads_head_dim_dtype():
    for m in MODELS.values():
        expected = 2 * m.num_layers * m.num_kv_heads * m.head_dim * m.kv_dtype_bytes
        assert m.kv_bytes_per_token == expected


def test_model_names_are_case_insensitive():
    assert get_model("Llama-3.1-8B") is get_model("llama-3.1-8b")


def test_unknown_model_raises_and_lists_known_presets():
    with pytest.raises(ValueError, match="gpt-9") as info:
        get_model("gpt-9")
    assert "llama-3.1-8b" in str(info.value)


def test_30gb_for_llama_3_1_8b_at_block_16_holds_about_229k_tokens():
    n = Capacity.parse("30GB").to_blocks(block_size=16, model="llama-3.1-8b")
    assert n == 30 * 10**9 // (131_072 * 16)
    assert n * 16 == pytest.approx(229_000, rel=0.005)


def test_binary_byte_units_are_powers_of_two():
    n = Capacity.parse("512MiB").to_blocks(block_size=16, model="llama-3.1-8b")
    assert n == 512 * 2**20 // (131_072 * 16)
    assert Capacity.parse("1GiB").value == 2**30
    assert Capacity.parse("1gb").value == 10**9


def test_bytes_without_a_model_raise():
    with pytest.raises(ValueError, match="30GB"):
        Capacity.parse("30GB").to_blocks(block_size=16)


def test_percent_is_a_fraction_of_unique_blocks():
    cap = Capacity.parse("10%")
    assert cap.kind == "fraction"
    assert cap.to_blocks(block_size=16, unique_blocks=12_345) == round(0.1 * 12_345)


def test_percent_without_the_trace_raises():
    with pytest.raises(ValueError, match="10%"):
        Capacity.parse("10%").to_blocks(block_size=16)


def test_tokens_resolve_to_whole_blocks():
    assert Capacity.parse("50000tok").to_blocks(block_size=16) == 3125
    assert Capacity.parse("50001tokens").to_blocks(block_size=16) == 3125


@pytest.mark.parametrize("spec", [4096, "4096", "4096blocks", " 4096 ", "4096 blk"])
def test_plain_numbers_are_blocks(spec):
    cap = Capacity.parse(spec)
    assert cap.kind == "blocks"
    assert cap.to_blocks(block_size=16) == 4096


def test_plain_int_capacity_ignores_block_size():
    assert Capacity.parse(100).to_blocks(block_size=1) == 100
    assert Capacity.parse(100).to_blocks(block_size=64) == 100


@pytest.mark.parametrize(
    "spec",
    ["abc", "", "-5", "10 parsecs", "1e6", "12%%", "0%", "150%", "GB", "4096 blocks please"],
)
def test_bad_spec_raises_value_error_naming_the_spec(spec):
    with pytest.raises(ValueError) as info:
        Capacity.parse(spec)
    assert repr(spec) in str(info.value)


@pytest.mark.parametrize(
    ("spec", "kwargs"),
    [("0", {}), ("3tok", {}), ("0.1%", {"unique_blocks": 10}), ("1KB", {"model": "llama-3.1-8b"})],
)
def test_capacity_below_one_block_raises_naming_the_spec(spec, kwargs):
    with pytest.raises(ValueError) as info:
        Capacity.parse(spec).to_blocks(block_size=16, **kwargs)
    assert repr(spec) in str(info.value)


def test_bytes_with_an_unknown_model_raise():
    with pytest.raises(ValueError, match="nope"):
        Capacity.parse("1GB").to_blocks(block_size=16, model="nope")
