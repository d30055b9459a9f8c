"""Where experiment files are and what a run writes, named once.

The runner lists the plots among a run's outputs, the report names them in ``summary.md`` and
``figures.write_plots`` draws them; the CLI, the runner and the suite read :data:`SUITE_DIR`.
All import this module (it sits below them and imports nothing, so neither matplotlib nor the
runner is loaded to learn a file name).
"""

from __future__ import annotations

#: the SemanticKV suite's configs (the default of ``skv run-all``)
SUITE_DIR = "experiments/semantickv"

#: plot -> file name, in the order ``write_plots`` returns them
PLOTS: dict[str, str] = {
    "ttft": "policy_comparison_avg_ttft.png",
    "hit": "policy_comparison_hit_rate.png",
    "saved": "tokens_saved_by_policy.png",
    "evict": "evictions_by_semantic_type.png",
    "weights": "adaptive_weights_over_time.png",
    "memory": "memory_utilization_over_time.png",
}
PLOT_FILES: tuple[str, ...] = tuple(PLOTS.values())
