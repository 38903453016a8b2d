"""The run folders under a work_dir: list them with their sizes, prune the old ones.

    image-classifier runs list                             # every run folder under runs/, oldest first
    image-classifier runs prune --keep-last 5              # all but the 5 newest runs go; prints the space freed
    image-classifier runs prune --since 2026-11-01         # runs started before that day go
    image-classifier runs prune --keep-last 5 --dry-run    # what would go, nothing removed

(``python -m flows.runs`` is the same command.)

Only run folders go (recognised by their run.json; tasks/storage/runs.py), never the registry: a registered model lives
there, not in a run folder. A run whose files changed in the last 10 minutes is kept: it may be training.
"""

from __future__ import annotations

import argparse
from datetime import datetime, timezone

from flows import cli
from tasks.errors import PipelineInputError
from tasks.storage.runs import RunFolder, list_runs, prune_runs


def _day(text: str) -> datetime:
    try:
        return datetime.fromisoformat(text).replace(tzinfo=timezone.utc)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a date: {text!r} (use YYYY-MM-DD)") from None


def _line(run: RunFolder) -> str:
    started = datetime.fromtimestamp(run.started, timezone.utc).strftime("%Y-%m-%d %H:%M")
    return f"{started} UTC  {run.size / 2**20:9.1f} MB  {run.path}"


def main(argv: list[str] | None = None, prog: str = "python -m flows.runs") -> int:
    parser = cli.CommandParser(prog=prog, description=__doc__.splitlines()[0])
    parser.add_argument("--work-dir", default="runs", help="the pipeline's work_dir (default: runs)")
    commands = parser.add_subparsers(dest="command", required=True)
    commands.add_parser("list", help="every run folder, oldest first, with its size")
    prune = commands.add_parser("prune", help="remove old run folders; prints the space freed")
    prune.add_argument("--keep-last", type=int, metavar="N", help="keep the N newest runs")
    prune.add_argument("--since", type=_day, metavar="YYYY-MM-DD", help="keep the runs started on or after that day")
    prune.add_argument("--dry-run", action="store_true", help="say what would go; remove nothing")
    cli.add_debug_flag(parser)
    args = parser.parse_args(argv)
    try:
        if args.command == "list":
            runs = list_runs(args.work_dir)
            for run in runs:
                print(_line(run))
            print(f"{len(runs)} runs, {sum(r.size for r in runs) / 2**20:.1f} MB")
            return 0
        removed, kept = prune_runs(args.work_dir, args.keep_last, args.since, args.dry_run)
    except PipelineInputError as error:
        cli.fail(error, args.debug)
    verb = "would remove" if args.dry_run else "removed"
    for run in removed:
        print(f"{verb}: {_line(run)}")
    freed = sum(run.size for run in removed) / 2**20
    print(f"{verb} {len(removed)} runs, {freed:.1f} MB {'to free' if args.dry_run else 'freed'}; {len(kept)} kept")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
