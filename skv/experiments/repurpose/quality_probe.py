"""What reusing a document's KV at a new position does to a real model's answers (ENGINE venv).

    .venv-vllm/bin/python -m skv.experiments.repurpose.quality_probe MODEL_DIR OUT.json
        [--items N] [--seed S] [--tasks lookup,first_item,compare] [--docs D] [--lines L]
        [--epic-k K] [--blend-share X] [--blend-layer I] [--threads T] [--workers W]

Runs in the engine venv (torch, transformers; MODEL_DIR from ``skv vllm smollm2 DIR``) on CPU,
float32, greedy decoding. A prompt is ``prefix | doc_1 | ... | doc_D | suffix``
(:mod:`.probe_tasks`); the prefix is a true prefix, so every scheme computes it as full prefill
does. Each document's KV is computed ON ITS OWN, at positions ``0..len-1``, as a cache that
stores documents once would hold it; then the schemes build the prompt's KV:

- ``naive``: the documents' KV concatenated as is (keys rotated for their old positions);
- ``rope_shift``: each document's keys re-rotated to their new positions: RoPE is a rotation
  per position, ``R(p + d) = R(d) R(p)``, so rotating by the document's offset ``d`` gives the
  keys full prefill would have at layer 0 exactly (layer 0's K and V depend on the token alone);
  later layers still miss the cross-document attention;
- ``epic``: ``rope_shift``, then the first ``epic_k`` tokens of each document recomputed
  (EPIC-like: the tokens that attend to nothing before them in the standalone KV);
- ``cacheblend``: ``rope_shift``, then the ``blend_share`` of document tokens whose layer
  ``blend_layer`` KV deviates most from full recompute recomputed (CacheBlend-like). Layer 1 by
  default: after the rotation layer 0 cannot deviate, and layer 1's recomputed KV is what
  recomputing layer 0 for every token gives, i.e. full prefill's layer-1 KV (taken from the
  ``full`` pass, which costs this probe nothing but is the same value). Deviation = L2 norm of
  the (K, V) difference over heads;
- ``full``: full prefill, the reference.

Recompute is layer by layer, as both systems do: one forward over the recomputed tokens alone,
at their positions (:meth:`Probe.recompute_kv`), in which at every layer the reused K and V of
the context take the recomputed tokens' K and V at their positions (a registered attention
function); a recomputed token attends to the reused KV of every position up to its own and to
its fellows' recomputed KV, and its own KV flows from its recomputed hidden state. (This is the
whole-context forward with every other position's KV substituted, :meth:`Probe.context_kv`
with a mask, at the cost of the recomputed tokens only: the test checks the two agree.)
The suffix is then prefilled on that cache and answered greedily.
The attention function is SDPA's with an explicit causal mask (mask interface registered too:
without it a suffix prefilled on a cache is masked as if it started at position 0).

Prints nothing but progress on stderr; writes ``OUT.json``: per item and scheme the generated
text, the extracted answer, the share of document tokens recomputed, and the run's metadata.
"""

from __future__ import annotations

import argparse
import json
import logging
import math
import os
import sys
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

from skv.experiments.repurpose.probe_tasks import MAX_NEW_TOKENS, SYSTEM, TASKS, extract, make_items

log = logging.getLogger("skv.quality_probe")

SCHEMES = ("full", "naive", "rope_shift", "epic", "cacheblend")
ATTENTION = "skv_probe"


class _Overrides:
    """Per layer, the reused K and V of a context and the positions that take them.

    Set around one context forward; the attention function reads it. ``record`` keeps each
    layer's final K and V (reused where substituted, computed elsewhere) to build the cache.
    """

    def __init__(self) -> None:
        self.keys: list[Any] | None = None
        self.values: list[Any] | None = None
        self.mask: Any = None  # bool (T, 1): True where the reused KV replaces the computed
        #: selective recompute: the positions computed (the forward's tokens) and their
        #: attention mask over the whole context, (1, 1, S, T)
        self.select: tuple[Any, Any] | None = None
        self.record: list[tuple[Any, Any]] | None = None


OVR = _Overrides()


def _register(torch: Any) -> None:
    from transformers import AttentionInterface
    from transformers.integrations.sdpa_attention import sdpa_attention_forward
    from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS, sdpa_mask

    def attention(module, query, key, value, attention_mask, **kw):
        if OVR.record is not None:
            li = module.layer_idx
            if OVR.select is not None:  # the reused context, the computed tokens written in
                positions, attention_mask = OVR.select
                k, v = OVR.keys[li].clone(), OVR.values[li].clone()
                k[:, :, positions] = key
                v[:, :, positions] = value
                key, value = k, v
            elif OVR.keys is not None:
                key = torch.where(OVR.mask, OVR.keys[li], key)
                value = torch.where(OVR.mask, OVR.values[li], value)
            OVR.record.append((key, value))
        return sdpa_attention_forward(module, query, key, value, attention_mask, **kw)

    AttentionInterface.register(ATTENTION, attention)
    ALL_MASK_ATTENTION_FUNCTIONS.register(ATTENTION, sdpa_mask)


class Probe:
    def __init__(self, model_dir: str | Path, threads: int) -> None:
        import torch
        from transformers import AutoModelForCausalLM, AutoTokenizer

        torch.set_num_threads(threads)
        torch.manual_seed(0)
        _register(torch)
        self.torch = torch
        self.tok = AutoTokenizer.from_pretrained(model_dir)
        self.model = AutoModelForCausalLM.from_pretrained(
            model_dir, attn_implementation=ATTENTION, dtype=torch.float32
        ).eval()
        cfg = self.model.config
        self.layers = cfg.num_hidden_layers
        eos = cfg.eos_token_id
        self.eos = {eos} if isinstance(eos, int) else set(eos)

    def ids(self, text: str) -> list[int]:
        return self.tok(text, add_special_tokens=False)["input_ids"]

    # ------------------------------------------------------------------ KV building blocks

    def context_kv(self, ctx: list[int], over: tuple[list, list, Any] | None) -> list[tuple]:
        """One forward over ``ctx``; per layer the K, V the cache holds (with ``over``'s reused
        KV substituted at its masked positions, layer by layer)."""
        OVR.keys, OVR.values, OVR.mask = over if over is not None else (None, None, None)
        OVR.record = []
        try:
            with self.torch.no_grad():
                # the decoder stack only: a context pass needs its KV, not its logits
                self.model.model(self.torch.tensor([ctx]), use_cache=False)
            return OVR.record
        finally:
            OVR.keys = OVR.values = OVR.mask = OVR.record = None

    def recompute_kv(self, ctx: list[int], keys: list, values: list, positions: list[int]):
        """Per layer the K, V of ``ctx`` with only ``positions`` recomputed, layer by layer, on
        the reused ``keys``/``values`` (what CacheBlend and EPIC compute): one forward over
        those tokens alone, at their positions, each attending to every position up to its
        own (reused KV, or its fellows' recomputed KV). The same KV as :meth:`context_kv` with
        every other position substituted (the hidden states of a substituted position reach
        nothing but its own discarded KV), at the cost of the recomputed tokens only."""
        torch = self.torch
        pos = torch.tensor(positions, dtype=torch.long)
        mask = (torch.arange(len(ctx))[None, :] <= pos[:, None])[None, None]
        OVR.keys, OVR.values, OVR.select = keys, values, (pos, mask)
        OVR.record = []
        try:
            with torch.no_grad():
                tokens = torch.tensor([[ctx[i] for i in positions]])
                self.model.model(tokens, position_ids=pos[None], use_cache=False)
            return OVR.record
        finally:
            OVR.keys = OVR.values = OVR.select = OVR.record = None

    def standalone_kv(self, doc: list[int]) -> list[tuple]:
        """A document's KV prefilled on its own, at positions 0..len-1."""
        return self.context_kv(doc, None)

    def rotate(self, k: Any, delta: int) -> Any:
        """Keys rotated by ``delta`` positions: RoPE's rotation at position ``delta`` applied to
        already rotated keys (rotations compose)."""
        from transformers.models.llama.modeling_llama import apply_rotary_pos_emb

        pos = self.torch.full((1, k.shape[-2]), delta)
        cos, sin = self.model.model.rotary_emb(k, pos)
        _, out = apply_rotary_pos_emb(k, k, cos, sin)
        return out

    def answers(
        self, caches: list[list[tuple]], ctx_len: int, suffix: list[int], n: int
    ) -> list[str]:
        """Greedy answers after ``suffix`` prefilled on each of several context caches of one
        length, as one batch: each decode step reads the weights once for all of them (a step
        is memory-bound). On the Intel VM of 2026-12-06 a row's logits were the same bits as
        alone (batch of 5 vs 1, max abs difference 0.0); a CPU whose math library picks another
        kernel for another batch size may differ in the last bits, which can flip a greedy
        answer only at a near-tie (the engine test compares batched and lone answers on the
        machine it runs on). A row that met end-of-sequence stops growing its answer while
        the others decode."""
        from transformers import DynamicCache

        torch = self.torch
        rows = len(caches)
        cache = DynamicCache(config=self.model.config)
        for li in range(self.layers):
            keys = torch.cat([layers[li][0] for layers in caches])
            values = torch.cat([layers[li][1] for layers in caches])
            cache.update(keys, values, li)
        out: list[list[int]] = [[] for _ in range(rows)]
        done = [False] * rows
        cur, pos = [suffix] * rows, ctx_len
        with torch.no_grad():
            for _ in range(n):
                ids = torch.tensor(cur)
                positions = torch.arange(pos, pos + len(cur[0]))[None].expand(rows, -1)
                logits = self.model(
                    ids, past_key_values=cache, use_cache=True, position_ids=positions
                ).logits
                picked = logits[:, -1].argmax(-1).tolist()
                for r, t in enumerate(picked):
                    if not done[r]:
                        done[r] = t in self.eos
                        if not done[r]:
                            out[r].append(t)
                if all(done):
                    break
                pos += len(cur[0])
                cur = [[t] for t in picked]
        return [self.tok.decode(o) for o in out]

    def plain_generate(self, prompt: list[int], n: int) -> str:
        """transformers' own greedy ``generate()`` on the whole prompt (the test's reference)."""
        torch = self.torch
        ids = torch.tensor([prompt])
        with torch.no_grad():
            out = self.model.generate(
                ids,
                attention_mask=torch.ones_like(ids),
                max_new_tokens=n,
                do_sample=False,
                pad_token_id=self.tok.eos_token_id,
            )
        new = [t for t in out[0, len(prompt) :].tolist() if t not in self.eos]
        return self.tok.decode(new)

    # ------------------------------------------------------------------ one item, all schemes

    def run_item(
        self, item: Any, schemes: tuple[str, ...], epic_k: int, share: float, layer: int
    ) -> dict[str, dict[str, Any]]:
        ctx = self.ids(SYSTEM)
        spans: list[tuple[int, int]] = []
        doc_ids = []
        for d in item.documents:
            di = self.ids(d)
            spans.append((len(ctx), len(di)))
            doc_ids.append(di)
            ctx += di
        suffix = self.ids(item.suffix)
        n = MAX_NEW_TOKENS[item.task]
        T = len(ctx)
        full = self.context_kv(ctx, None)
        out: dict[str, dict[str, Any]] = {}
        doc_tokens = sum(length for _, length in spans)

        # (scheme, its context cache, tokens recomputed), answered at the end as one batch: a
        # cache queued here is shared with later schemes and never changed in place after
        pending = [("full", full, doc_tokens)] if "full" in schemes else []
        if set(schemes) - {"full"}:
            pending += self._reused_schemes(
                ctx, spans, doc_ids, full, schemes, epic_k, share, layer
            )
        if not pending:
            return out
        texts = self.answers([layers for _, layers, _ in pending], T, suffix, n)
        for (name, _, recomputed), text in zip(pending, texts, strict=True):
            out[name] = {
                "text": text,
                "extracted": extract(item, text),
                "recomputed": recomputed,
                "doc_tokens": doc_tokens,
            }
        return out

    def _reused_schemes(
        self,
        ctx: list[int],
        spans: list[tuple[int, int]],
        doc_ids: list[list[int]],
        full: list[tuple],
        schemes: tuple[str, ...],
        epic_k: int,
        share: float,
        layer: int,
    ) -> list[tuple[str, list[tuple], int]]:
        """The schemes built from reused document KV, in SCHEMES order: (scheme, context
        cache, document tokens recomputed)."""
        torch = self.torch
        out: list[tuple[str, list[tuple], int]] = []
        T = len(ctx)
        doc_tokens = sum(length for _, length in spans)
        # reused KV: the prefix as full prefill has it (a true prefix), documents standalone
        naive_k = [full[li][0].clone() for li in range(self.layers)]
        naive_v = [full[li][1].clone() for li in range(self.layers)]
        shift_k = [k.clone() for k in naive_k]
        reused = torch.zeros(T, 1, dtype=torch.bool)
        for (off, length), di in zip(spans, doc_ids, strict=True):
            own = self.standalone_kv(di)
            for li, (k, v) in enumerate(own):
                naive_k[li][:, :, off : off + length] = k
                naive_v[li][:, :, off : off + length] = v
                shift_k[li][:, :, off : off + length] = self.rotate(k, off)
            reused[off : off + length] = True
        if "naive" in schemes:
            out.append(("naive", list(zip(naive_k, naive_v, strict=True)), 0))
        if "rope_shift" in schemes:
            out.append(("rope_shift", list(zip(shift_k, naive_v, strict=True)), 0))
        if "epic" in schemes:
            keep = reused.clone()
            for off, length in spans:
                keep[off : off + min(epic_k, length)] = False
            redo = reused & ~keep
            out.append(("epic", self._repaired(ctx, shift_k, naive_v, redo), int(redo.sum())))
        if "cacheblend" in schemes:
            fk, fv = full[layer]
            dev = (fk - shift_k[layer]).pow(2).sum(dim=(0, 1, 3)) + (fv - naive_v[layer]).pow(
                2
            ).sum(dim=(0, 1, 3))
            dev = torch.where(reused[:, 0], dev, torch.full_like(dev, -1.0))
            n_re = math.ceil(share * doc_tokens)
            top = torch.topk(dev, n_re).indices
            keep = reused.clone()
            keep[top] = False
            out.append(("cacheblend", self._repaired(ctx, shift_k, naive_v, reused & ~keep), n_re))
        return out

    def _repaired(self, ctx: list[int], keys: list, values: list, redo: Any) -> list[tuple]:
        """The reused KV with the document tokens flagged in ``redo`` (bool (T, 1))
        recomputed; the prefix keeps full prefill's KV (already in ``keys``/``values``)."""
        positions = [int(i) for i in redo[:, 0].nonzero()[:, 0]]
        if not positions:
            return list(zip(keys, values, strict=True))
        return self.recompute_kv(ctx, keys, values, positions)


def _work(job: tuple[dict[str, Any], int, int]) -> list[dict[str, Any]]:
    """One worker's share of the items (every ``workers``-th, from ``w``): its rows."""
    opts, w, workers = job
    probe = Probe(opts["model"], opts["threads"])
    rows: list[dict[str, Any]] = []
    t0 = time.monotonic()
    shape = {"docs": opts["docs"], "items": opts["lines"]}
    todo = [
        item
        for task in opts["tasks"]
        for item in make_items(opts["seed"], task, opts["items"], **shape)
    ][w::workers]
    for n, item in enumerate(todo, 1):
        res = probe.run_item(
            item, opts["schemes"], opts["epic_k"], opts["blend_share"], opts["blend_layer"]
        )
        for scheme, r in res.items():
            rows.append(
                {
                    "task": item.task,
                    "item": item.index,
                    "scheme": scheme,
                    "answer": item.answer,
                    "chance": item.chance,
                    **r,
                }
            )
        if n % 10 == 0 or n == len(todo):
            log.info("worker %d: %d/%d items, %.0f s", w, n, len(todo), time.monotonic() - t0)
    return rows


def run(args: argparse.Namespace) -> dict[str, Any]:
    """All items through every scheme, split over ``args.workers`` processes of ``args.threads``
    torch threads each (one thread per process: torch's OpenMP threads spin, and two of them
    on cores shared with anything else run many times slower than one). Rows are sorted, so
    the result does not depend on the number of workers."""
    import torch
    import transformers

    schemes = tuple(s for s in SCHEMES if s in args.schemes.split(","))
    tasks = [t for t in TASKS if t in args.tasks.split(",")]
    opts = {
        "model": str(args.model),
        "threads": args.threads,
        "tasks": tasks,
        "schemes": schemes,
        "seed": args.seed,
        "items": args.items,
        "docs": args.docs,
        "lines": args.lines,
        "epic_k": args.epic_k,
        "blend_share": args.blend_share,
        "blend_layer": args.blend_layer,
    }
    t0 = time.monotonic()
    jobs = [(opts, w, args.workers) for w in range(args.workers)]
    if args.workers == 1:
        parts = [_work(jobs[0])]
    else:
        import multiprocessing as mp
        from concurrent.futures import ProcessPoolExecutor

        with ProcessPoolExecutor(args.workers, mp_context=mp.get_context("spawn")) as pool:
            parts = list(pool.map(_work, jobs))
    order = {s: i for i, s in enumerate(SCHEMES)}
    rows = sorted(
        (r for part in parts for r in part),
        key=lambda r: (TASKS.index(r["task"]), r["item"], order[r["scheme"]]),
    )
    meta_file = Path(args.model) / "skv_smollm2.json"
    example = make_items(args.seed, tasks[0], 1, docs=args.docs, items=args.lines)[0]
    return {
        "model": json.loads(meta_file.read_text()) if meta_file.exists() else str(args.model),
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "cpu": _cpu(),
        **{k: v for k, v in opts.items() if k != "model"},
        "schemes": list(schemes),
        "workers": args.workers,
        "example": {**asdict(example), "suffix": example.suffix},
        "seconds": round(time.monotonic() - t0, 1),
        "rows": rows,
    }


def _cpu() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return f"{line.split(':', 1)[1].strip()} ({os.cpu_count()} CPUs)"
    except OSError:
        pass
    return f"{os.cpu_count()} CPUs"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("model", help="a SmolLM2 directory from `skv vllm smollm2 DIR`")
    p.add_argument("out", help="the JSON file to write")
    p.add_argument("--items", type=int, default=200, help="items per task")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--tasks", default=",".join(TASKS))
    p.add_argument("--schemes", default=",".join(SCHEMES))
    p.add_argument("--docs", type=int, default=3, help="documents per prompt")
    p.add_argument("--lines", type=int, default=3, help="items listed per document")
    p.add_argument("--epic-k", type=int, default=8)
    p.add_argument("--blend-share", type=float, default=0.15)
    p.add_argument("--blend-layer", type=int, default=1)
    p.add_argument("--threads", type=int, default=1, help="torch threads per worker")
    p.add_argument("--workers", type=int, default=1, help="processes, items split among them")
    args = p.parse_args(argv)
    bad = [t for t in args.tasks.split(",") if t not in TASKS]
    bad += [s for s in args.schemes.split(",") if s not in SCHEMES]
    ok = args.items >= 1 and args.epic_k >= 0 and 0 <= args.blend_share <= 1
    ok = ok and args.threads >= 1 and args.workers >= 1 and args.blend_layer >= 0
    if bad or not ok:
        rule = "items, threads, workers >= 1; epic-k, blend-layer >= 0; blend-share in [0, 1]"
        p.error(f"bad arguments: {bad or rule}")
    logging.basicConfig(level=logging.INFO, format="%(message)s", stream=sys.stderr)
    result = run(args)
    out = Path(args.out)
    tmp = out.with_suffix(".part")
    tmp.write_text(json.dumps(result, indent=1) + "\n")
    tmp.replace(out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
