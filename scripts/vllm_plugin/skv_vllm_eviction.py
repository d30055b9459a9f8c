"""Entry point of skv's vLLM eviction plugin: a shim, so the engine venv needs no copy of skv.

vLLM calls ``register`` in each of its processes. With ``SKV_EVICTION`` unset it does nothing
(stock vLLM). Otherwise it puts the skv checkout named by ``SKV_CHECKOUT`` on ``sys.path`` and
hands over to ``skv.vllm.eviction_plugin.register``, which checks the vLLM version and patches.
"""

import os
import sys


def register() -> None:
    if not os.environ.get("SKV_EVICTION", "").strip():
        return
    root = os.environ.get("SKV_CHECKOUT", "")
    if not root or not os.path.isfile(os.path.join(root, "skv", "vllm", "eviction_plugin.py")):
        raise RuntimeError(
            "skv eviction plugin: SKV_EVICTION is set but SKV_CHECKOUT does not name an skv "
            f"checkout (got {root!r}); start the engine with `skv vllm serve --eviction ...`"
        )
    if root not in sys.path:
        sys.path.insert(0, root)
    from skv.vllm.eviction_plugin import register as skv_register

    skv_register()
