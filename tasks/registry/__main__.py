"""``python -m tasks.registry``: the registry's command line is flows/registry.py now (``image-classifier registry``,
``python -m flows.registry``). This name answers the same until its last callers (flows/cli.py's COMMANDS,
tests/helpers.py's registry_cli) name flows.registry; then it goes (issue 55, item 2). It finds the command by name:
nothing in tasks/ imports flows/."""

from __future__ import annotations

import importlib
import sys


def main(argv: list[str] | None = None, prog: str = "python -m tasks.registry") -> int:
    return importlib.import_module("flows.registry").main(argv, prog)


if __name__ == "__main__":
    sys.exit(main())
