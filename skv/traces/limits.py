"""The limits every trace reader applies before anything is sized by a trace's numbers.

- :data:`MAX_TOKENS` (2**24 = 16,777,216) tokens for one request's prompt, and separately for its
  output. It is above the longest context window any served model offers (10M tokens in 2025),
  and replay memory grows with it: the cache works on blocks of ``block_size`` tokens (about
  160 bytes each), so one request at the limit is ~1M blocks (~170 MB) at 16-token blocks,
  while the line that declares it is a few bytes. A larger length is an error naming
  ``file:line: field``.
- hash ids are unsigned 64-bit integers (:data:`HASH_ID_LIMIT`), as in every upstream format
  and in skv's own block keys; a negative id is an error.
- arrival times are >= 0; a negative one is an error (each reader's model says so).

Suspect but harmless data is accepted with one warning per file naming the first
``file:line``: repeated request ids (native traces) and hash ids that cover fewer blocks than
the prompt declares (those tokens can never hit, so hit rates are diluted).
"""

from __future__ import annotations

from typing import Annotated

from pydantic import Field

#: most tokens one request's prompt (and, separately, its output) may declare
MAX_TOKENS = 1 << 24
#: hash ids are unsigned 64-bit: 0 <= id < HASH_ID_LIMIT
HASH_ID_LIMIT = 1 << 64

#: a token count a trace declares: 0 <= n <= MAX_TOKENS
TokenCount = Annotated[int, Field(ge=0, le=MAX_TOKENS)]
#: one block's hash id
HashId = Annotated[int, Field(ge=0, lt=HASH_ID_LIMIT)]

#: what an error about a length over MAX_TOKENS adds
MAX_TOKENS_REASON = (
    "skv reads at most MAX_TOKENS tokens per request (skv.traces: above any model's context "
    "window, and replay memory grows with it)"
)
