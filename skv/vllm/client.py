"""An async streaming client for an OpenAI-compatible server (vLLM) that measures each request.

Per request (:class:`RequestResult`): TTFT (send to the first streamed chunk that carries
``choices``), inter-token latencies (gaps between successive output chunks after
the first; a chat stream's role-only opening chunk counts for TTFT only), end-to-end
latency, prompt and completion tokens and ``cached_tokens`` from ``usage.prompt_tokens_details``
(the client asks for ``stream_options: {include_usage: true}``; vLLM fills the details when
started with ``--enable-prompt-tokens-details``). Errors (HTTP status, connection, timeout, an
error event in the stream) are recorded on the result, never raised.

:func:`replay` sends a list of prompts open-loop (each at its own offset in seconds from the
start, whether or not earlier ones finished) or closed-loop (a fixed number in flight).

    async with StreamingClient(srv.base_url, srv.model_name) as c:
        r = await c.complete("Hello", max_tokens=8)
        print(r.ttft, r.cached_tokens)
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import httpx

#: a prompt for :func:`replay`: text (``/v1/completions``), a list of chat messages
#: (``/v1/chat/completions``), or a dict request body holding ``prompt`` or ``messages`` plus
#: any other fields (``max_tokens``, ``temperature``...), optionally an ``id``.
Prompt = str | list[dict[str, Any]] | dict[str, Any]


@dataclass
class RequestResult:
    """What one streamed request measured. Times in seconds; ``sent_at`` and ``scheduled_at``
    from the start of the replay (or of the client, outside a replay)."""

    id: Any = None
    endpoint: str = "completions"
    ok: bool = False
    error: str | None = None
    status: int | None = None
    scheduled_at: float | None = None
    sent_at: float = 0.0
    ttft: float | None = None
    e2e: float | None = None
    itl: list[float] = field(default_factory=list)
    chunks: int = 0
    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    cached_tokens: int | None = None
    finish_reason: str | None = None
    text: str = ""

    @property
    def tpot(self) -> float | None:
        """Mean time per output token after the first (None with fewer than two tokens)."""
        if self.e2e is None or self.ttft is None or not self.completion_tokens:
            return None
        if self.completion_tokens < 2:
            return None
        return (self.e2e - self.ttft) / (self.completion_tokens - 1)

    @property
    def hit_fraction(self) -> float | None:
        """cached_tokens / prompt_tokens, when the server reported both."""
        if self.cached_tokens is None or not self.prompt_tokens:
            return None
        return self.cached_tokens / self.prompt_tokens

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["tpot"] = self.tpot
        return d


#: seconds an idle connection is kept for reuse (this client's, and the proxy's and router's
#: upstream connections'). Well under the 5 s after which uvicorn (and so vLLM's API server)
#: closes an idle connection: with equal limits a request can be sent on a connection its
#: server is just closing (the pool checks for a close only when it picks the connection), and
#: it fails with no response
KEEPALIVE_S = 2.0


class StreamingClient:
    """Streams ``/v1/completions`` and ``/v1/chat/completions`` with httpx and times each chunk.

    ``transport`` replaces the network (``httpx.MockTransport`` in tests). Default sampling is
    greedy with ``ignore_eos`` so that every request decodes exactly ``max_tokens`` tokens (a
    vLLM extension; pass ``ignore_eos=False`` for plain OpenAI servers).
    """

    def __init__(
        self,
        base_url: str,
        model: str,
        *,
        timeout: float = 600.0,
        api_key: str | None = None,
        max_connections: int = 256,
        transport: httpx.AsyncBaseTransport | None = None,
        ignore_eos: bool = True,
        temperature: float = 0.0,
    ) -> None:
        self.base_url = base_url.rstrip("/")
        self.model = model
        self.ignore_eos = ignore_eos
        self.temperature = temperature
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self._http = httpx.AsyncClient(
            base_url=self.base_url,
            timeout=httpx.Timeout(timeout, connect=30.0),
            limits=httpx.Limits(
                max_connections=max_connections,
                max_keepalive_connections=64,
                keepalive_expiry=KEEPALIVE_S,
            ),
            headers=headers,
            transport=transport,
        )
        self._t0 = time.perf_counter()

    async def __aenter__(self) -> StreamingClient:
        return self

    async def __aexit__(self, *exc) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        await self._http.aclose()

    # ------------------------------------------------------------------ requests

    async def complete(
        self, prompt: str | list[int], *, max_tokens: int = 16, **body
    ) -> RequestResult:
        """One streamed ``/v1/completions`` request."""
        return await self.request({"prompt": prompt, "max_tokens": max_tokens, **body})

    async def chat(
        self, messages: list[dict[str, Any]], *, max_tokens: int = 16, **body
    ) -> RequestResult:
        """One streamed ``/v1/chat/completions`` request."""
        return await self.request({"messages": messages, "max_tokens": max_tokens, **body})

    async def request(
        self,
        item: Prompt,
        *,
        id: Any = None,
        scheduled_at: float | None = None,
        t0: float | None = None,
        **defaults,
    ) -> RequestResult:
        """Send one prompt (see :data:`Prompt`), stream the reply, return what it measured."""
        body = _body(item, defaults)
        rid = body.pop("id", id)
        chat = "messages" in body
        endpoint = "chat/completions" if chat else "completions"
        body.setdefault("model", self.model)
        body.setdefault("temperature", self.temperature)
        if self.ignore_eos:
            body.setdefault("ignore_eos", True)
        body["stream"] = True
        opts = dict(body.get("stream_options") or {})
        opts["include_usage"] = True
        body["stream_options"] = opts

        base = self._t0 if t0 is None else t0
        res = RequestResult(id=rid, endpoint=endpoint, scheduled_at=scheduled_at)
        start = time.perf_counter()
        res.sent_at = start - base
        parts: list[str] = []
        last = start
        first_output_seen = False
        try:
            async with self._http.stream("POST", f"/v1/{endpoint}", json=body) as resp:
                res.status = resp.status_code
                if resp.status_code >= 400:
                    detail = (await resp.aread()).decode(errors="replace")
                    res.error = f"HTTP {resp.status_code}: {_error_message(detail)}"
                    res.e2e = time.perf_counter() - start
                    return res
                async for data in _sse_data(resp):
                    now = time.perf_counter()
                    if data == "[DONE]":
                        break
                    try:
                        chunk = json.loads(data)
                    except json.JSONDecodeError:
                        res.error = f"bad chunk: {data[:200]!r}"
                        continue
                    if "error" in chunk and not chunk.get("choices"):
                        res.error = f"stream error: {_error_message(chunk['error'])}"
                        continue
                    usage = chunk.get("usage")
                    if usage:
                        _read_usage(res, usage)
                    choices = chunk.get("choices") or []
                    if not choices:
                        continue
                    res.chunks += 1
                    carries_output = False
                    for ch in choices:
                        piece = _piece(ch, chat)
                        parts.append(piece)
                        carries_output |= _is_output(ch)
                        if ch.get("finish_reason"):
                            res.finish_reason = ch["finish_reason"]
                    if res.ttft is None:
                        res.ttft = now - start
                        # a chat stream may open with a role-only chunk: it is the first chunk
                        # (TTFT) but the first output chunk after it opens no inter-token gap
                        first_output_seen = carries_output
                        last = now
                    elif carries_output:
                        if first_output_seen:
                            res.itl.append(now - last)
                        first_output_seen = True
                        last = now
        except (httpx.HTTPError, OSError) as exc:
            res.error = f"{type(exc).__name__}: {exc}".rstrip(": ")
        res.e2e = time.perf_counter() - start
        res.text = "".join(parts)
        if res.error is None and res.ttft is None:
            res.error = "stream ended without output"
        res.ok = res.error is None
        return res


# ---------------------------------------------------------------------- replay


async def replay(
    client: StreamingClient,
    prompts: Sequence[Prompt],
    *,
    arrival_times: Sequence[float] | None = None,
    concurrency: int | None = None,
    **defaults,
) -> list[RequestResult]:
    """Send every prompt and return the results in prompt order.

    Open loop: ``arrival_times[i]`` is when prompt ``i`` is sent, in seconds from the start
    (non-decreasing is not required). Closed loop: ``concurrency`` requests in flight, the next
    sent as one finishes, in list order. Exactly one of the two. ``defaults`` go into every request
    body that does not set them (``max_tokens=16`` unless given).
    """
    if (arrival_times is None) == (concurrency is None):
        raise ValueError("replay: give exactly one of arrival_times (open loop) or concurrency")
    defaults.setdefault("max_tokens", 16)
    n = len(prompts)
    results: list[RequestResult | None] = [None] * n
    t0 = time.perf_counter()

    def item_id(i: int) -> Any:
        p = prompts[i]
        return p.get("id", i) if isinstance(p, dict) else i

    if arrival_times is not None:
        if len(arrival_times) != n:
            raise ValueError(f"replay: {n} prompts but {len(arrival_times)} arrival times")
        if any(t < 0 for t in arrival_times):
            raise ValueError("replay: arrival times must be >= 0")

        async def fire(i: int) -> None:
            delay = t0 + arrival_times[i] - time.perf_counter()
            if delay > 0:
                await asyncio.sleep(delay)
            results[i] = await client.request(
                prompts[i], id=item_id(i), scheduled_at=float(arrival_times[i]), t0=t0, **defaults
            )

        await asyncio.gather(*(fire(i) for i in range(n)))
    else:
        if concurrency is None or concurrency < 1:
            raise ValueError("replay: concurrency must be >= 1")
        next_i = 0

        async def worker() -> None:
            nonlocal next_i
            while next_i < n:
                i = next_i
                next_i += 1
                results[i] = await client.request(prompts[i], id=item_id(i), t0=t0, **defaults)

        await asyncio.gather(*(worker() for _ in range(min(concurrency, n))))
    return [r for r in results if r is not None]


def replay_sync(
    base_url: str,
    model: str,
    prompts: Sequence[Prompt],
    *,
    arrival_times: Sequence[float] | None = None,
    concurrency: int | None = None,
    client_kwargs: dict[str, Any] | None = None,
    **defaults,
) -> list[RequestResult]:
    """:func:`replay` from synchronous code (runs its own event loop)."""

    async def go() -> list[RequestResult]:
        async with StreamingClient(base_url, model, **(client_kwargs or {})) as c:
            return await replay(
                c, prompts, arrival_times=arrival_times, concurrency=concurrency, **defaults
            )

    return asyncio.run(go())


def summarize(results: Sequence[RequestResult]) -> dict[str, Any]:
    """Counts, error count, median/p90 TTFT, ITL and e2e, and the token-weighted cached share."""
    import statistics

    ok = [r for r in results if r.ok]

    def pct(xs: list[float], q: float) -> float | None:
        if not xs:
            return None
        xs = sorted(xs)
        return xs[min(len(xs) - 1, int(q * len(xs)))]

    ttft = [r.ttft for r in ok if r.ttft is not None]
    e2e = [r.e2e for r in ok if r.e2e is not None]
    itl = [g for r in ok for g in r.itl]
    prompt = sum(r.prompt_tokens or 0 for r in ok)
    cached = sum(r.cached_tokens or 0 for r in ok)
    return {
        "requests": len(results),
        "ok": len(ok),
        "errors": len(results) - len(ok),
        "ttft_median": statistics.median(ttft) if ttft else None,
        "ttft_p90": pct(ttft, 0.9),
        "itl_median": statistics.median(itl) if itl else None,
        "e2e_median": statistics.median(e2e) if e2e else None,
        "prompt_tokens": prompt,
        "cached_tokens": cached,
        "cached_fraction": cached / prompt if prompt else None,
    }


# ---------------------------------------------------------------------- helpers


def _body(item: Prompt, defaults: dict[str, Any]) -> dict[str, Any]:
    if isinstance(item, str):
        body: dict[str, Any] = {"prompt": item}
    elif isinstance(item, list):
        body = {"messages": item}
    elif isinstance(item, dict):
        if "prompt" not in item and "messages" not in item:
            raise ValueError("a dict prompt needs 'prompt' or 'messages'")
        body = dict(item)
    else:
        raise TypeError(f"prompt of type {type(item).__name__}: expected str, list or dict")
    for k, v in defaults.items():
        body.setdefault(k, v)
    return body


async def _sse_data(resp: httpx.Response):
    """The ``data:`` payloads of a server-sent event stream (multi-line data joined by \\n)."""
    buf: list[str] = []
    async for line in resp.aiter_lines():
        if not line:
            if buf:
                yield "\n".join(buf)
                buf = []
            continue
        if line.startswith(":"):
            continue
        if line.startswith("data:"):
            payload = line[5:]
            buf.append(payload[1:] if payload.startswith(" ") else payload)
    if buf:
        yield "\n".join(buf)


def _piece(choice: dict[str, Any], chat: bool) -> str:
    if chat or "delta" in choice:
        delta = choice.get("delta") or {}
        return delta.get("content") or delta.get("reasoning_content") or ""
    return choice.get("text") or ""


def _is_output(choice: dict[str, Any]) -> bool:
    """Whether a streamed choice reports an engine step: any completion chunk, any chat delta
    but the role-only opening one. Its text may be empty (a token that ends inside a UTF-8
    character is held back by the detokenizer), so emptiness is no test."""
    if choice.get("finish_reason"):
        return True
    if "delta" not in choice:
        return "text" in choice
    delta = choice.get("delta") or {}
    if "role" in delta:
        return bool(
            delta.get("content") or delta.get("reasoning_content") or delta.get("tool_calls")
        )
    return True


def _read_usage(res: RequestResult, usage: dict[str, Any]) -> None:
    if usage.get("prompt_tokens") is not None:
        res.prompt_tokens = int(usage["prompt_tokens"])
    if usage.get("completion_tokens") is not None:
        res.completion_tokens = int(usage["completion_tokens"])
    details = usage.get("prompt_tokens_details") or {}
    if details.get("cached_tokens") is not None:
        res.cached_tokens = int(details["cached_tokens"])


def _error_message(detail: Any) -> str:
    if isinstance(detail, str):
        try:
            detail = json.loads(detail)
        except json.JSONDecodeError:
            return detail.strip()[:500]
    if isinstance(detail, dict):
        inner = detail.get("error", detail)
        if isinstance(inner, dict):
            return str(inner.get("message") or inner)[:500]
        return str(inner)[:500]
    return str(detail)[:500]
