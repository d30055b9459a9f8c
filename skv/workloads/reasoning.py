"""``reasoning``: multi-turn chat with a reasoning model whose answers open with ``<think>``.

Chat templates differ on past reasoning: some (DeepSeek-R1, Qwen3) strip earlier turns'
``<think>`` blocks from the history, others keep them. Kept reasoning appears in later prompts
as REASONING segments (long, and reused only by the same session's next turns: SAECache
measures 2.2% reuse for chain of thought); stripped reasoning changes the history the next turn
sends, so the answer the model generated (reasoning + text) is not a prefix of it.
"""

from __future__ import annotations

import numpy as np

from skv.workloads.base import Chat, Context, Fraction, Message, Tokens, draw_length
from skv.workloads.multi_turn_chat import AnswerMaker, ChatParams, conversation_chats

NAME = "reasoning"


class ReasoningParams(ChatParams):
    """Parameters of ``reasoning``: those of ``multi_turn_chat`` plus the reasoning ones."""

    reasoning_tokens: int = Tokens(800, "mean length of an answer's <think> block")
    keep_reasoning: float = Fraction(
        0.5, "share of sessions whose history keeps past <think> blocks (0: always stripped)"
    )


def chats(params: ReasoningParams, ctx: Context) -> list[Chat]:
    """``multi_turn_chat`` sessions (same parameters and defaults) with reasoning answers.

    - Each answer is ``<think>`` + ``reasoning_tokens`` (800) of reasoning + ``</think>``, then
      ``answer_tokens`` (250) of answer: two segments, REASONING and ASSISTANT_HISTORY.
      ``output_tokens`` counts both; ``output_hash`` is the content hash of the whole answer
      text; ``extra["output_segments"]`` lists the two segments.
    - With probability ``keep_reasoning`` (0.5) a session's later turns quote answers whole
      (REASONING segments in their prompts), else with the ``<think>`` block stripped (only the
      ASSISTANT_HISTORY segment). ``extra["keeps_reasoning"]`` records the choice.
    """
    p = params

    def make_answer(session_rng: np.random.Generator, ctx: Context) -> tuple[AnswerMaker, dict]:
        keep = bool(session_rng.random() < p.keep_reasoning)

        def answer(rng: np.random.Generator, _turn: int) -> tuple[Message, Message]:
            thought = ctx.textgen.fresh(rng, draw_length(rng, p.reasoning_tokens, p.length_sigma))
            text = ctx.textgen.fresh(rng, draw_length(rng, p.answer_tokens, p.length_sigma))
            think = ctx.textgen.join("<think>\n", thought, "\n</think>")
            full = Message("assistant", (think, text))
            return full, full if keep else Message("assistant", (text,))

        return answer, {"keeps_reasoning": keep}

    return conversation_chats(p, ctx, NAME, make_answer)
