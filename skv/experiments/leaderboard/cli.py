"""``skv leaderboard``: rank every eviction policy on the config's traces and any the user passes;
writes ``leaderboard.csv`` (per trace x capacity x policy x setting), ``leaderboard.md`` (the
ranking), ``runs.csv`` (per seed), ``tuning.csv`` and ``tuned.json`` (the equal-budget tuning)."""

from __future__ import annotations

import argparse
import json
import logging
from pathlib import Path

log = logging.getLogger(__name__)

DEFAULT_CONFIG = "experiments/leaderboard/policy_leaderboard.yaml"


def _user_trace(spec: str, fmt_options: list[str]) -> object:
    """``PATH`` or ``PATH=LABEL`` as a TraceEntry (format detected from the file)."""
    from skv.experiments.leaderboard.config import TraceEntry

    path, _, label = spec.partition("=")
    label = label or Path(path).stem.replace(" ", "_") or "user"
    options = {}
    for item in fmt_options:
        key, sep, value = item.partition("=")
        if not sep:
            raise ValueError(f"--format-option {item!r}: expected KEY=VALUE")
        try:
            options[key] = json.loads(value)
        except json.JSONDecodeError:
            options[key] = value
    try:
        return TraceEntry(label=label, trace=path, format_options=options)
    except ValueError as exc:
        raise ValueError(f"--trace {spec!r}: {exc}") from None


def cmd_leaderboard(args: argparse.Namespace) -> int:
    from skv.experiments.leaderboard import study
    from skv.experiments.leaderboard.config import load_config
    from skv.fileio import atomic_dir

    config = load_config(args.config, quick=args.quick)
    if args.policies:
        config = config.model_copy(update={"policies": args.policies})
        type(config).model_validate(config.model_dump())  # names checked like the file's
    if args.no_tuning:
        config = config.model_copy(
            update={"tuning": config.tuning.model_copy(update={"traces": []})}
        )
    extra = [_user_trace(t, args.format_option) for t in args.trace]
    if args.only_user_traces:
        if not extra:
            raise ValueError("--only-user-traces needs at least one --trace")
        config = config.model_copy(update={"traces": extra})
        extra = []
    lb = study.run(config, extra_traces=extra, jobs=args.jobs)  # type: ignore[arg-type]
    out = Path(args.output)
    with atomic_dir(out, last=["leaderboard.md"]) as tmp:
        lb.summary.to_csv(tmp / "leaderboard.csv", index=False, lineterminator="\n")
        lb.runs.to_csv(tmp / "runs.csv", index=False, lineterminator="\n")
        lb.tuning_runs.to_csv(tmp / "tuning.csv", index=False, lineterminator="\n")
        (tmp / "tuned.json").write_text(json.dumps(lb.tuned, indent=2, sort_keys=True) + "\n")
        md = study.markdown(lb.ranking, config.title)
        if lb.missing:
            md += "\nLeft out (data not found):\n" + "".join(
                f"- {k}: {v}\n" for k, v in lb.missing.items()
            )
        (tmp / "leaderboard.md").write_text(md)
    print(md)
    log.info("leaderboard written to %s", out)
    return 0


def register(subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:
    """Add ``leaderboard`` to the ``skv`` command line."""
    p = subparsers.add_parser(
        "leaderboard",
        help="rank every eviction policy by the share of the LRU->Belady gap it closes on the "
        "config's traces and yours (simulated replay; CSV + markdown)",
    )
    p.add_argument("--config", default=DEFAULT_CONFIG, help=f"default {DEFAULT_CONFIG}")
    p.add_argument("--quick", action="store_true", help="the config's reduced version")
    p.add_argument(
        "--trace", action="append", default=[], metavar="PATH[=LABEL]",
        help="also rank on this trace (any format skv reads); repeatable",
    )  # fmt: skip
    p.add_argument(
        "--format-option", action="append", default=[], metavar="KEY=VALUE",
        help="loader option for the --trace files (e.g. session_interval_s=30); repeatable",
    )  # fmt: skip
    p.add_argument("--only-user-traces", action="store_true", help="rank on --trace files only")
    p.add_argument("--policies", nargs="+", default=None, help="rank only these (default: all)")
    p.add_argument("--no-tuning", action="store_true", help="defaults only (skip tuning)")
    p.add_argument("--jobs", type=int, default=None, help="parallel replays (default: CPUs)")
    p.add_argument("--output", default="results/leaderboard", help="output directory")
    p.set_defaults(func=cmd_leaderboard)
    return p
