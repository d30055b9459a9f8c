"""``skv pipeline run|check|list|paper ...``: the paper pipeline
(``python -m skv.artifact.pipeline``).

Everything after ``pipeline`` goes to :func:`skv.artifact.pipeline.main` unchanged, so both
spellings take the same arguments and give the same exit status.
"""

from __future__ import annotations

import argparse


def cmd_pipeline(args: argparse.Namespace) -> int:
    from skv.artifact.pipeline import main as pipeline_main

    return pipeline_main(["--help"] if args.pipeline_help else args.pipeline_args)


def register(subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:
    """Add ``pipeline`` to the ``skv`` command line; return its parser."""
    p = subparsers.add_parser(
        "pipeline",
        help="run | check | list | paper: notebooks -> figures, tables, claims check, PDF "
        "(also python -m skv.artifact.pipeline)",
        description="The paper pipeline (notebooks -> figures, tables, claims check, PDF). "
        "Arguments are those of python -m skv.artifact.pipeline; `skv pipeline --help` lists them.",
        add_help=False,  # --help is the pipeline's own
    )
    p.add_argument("-h", "--help", dest="pipeline_help", action="store_true")
    p.add_argument("pipeline_args", nargs=argparse.REMAINDER, help="run|check|list|paper ...")
    p.set_defaults(func=cmd_pipeline)
    return p
