"""The terminal of the command lines: ``CommandParser``, argparse whose error is one line (no Prefect: the endpoint's
command line uses it too). Prefect's console filtered for a while is flows/console.py's."""

from __future__ import annotations

import argparse
import typing
from typing import Any


class CommandParser(argparse.ArgumentParser):
    """An argparse parser whose error is one line: ``prog: error: ... (--help lists the flags)``."""

    def __init__(self, *args: Any, hint: str = "--help lists the flags", **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.hint = hint

    def error(self, message: str) -> typing.NoReturn:
        self.exit(2, f"{self.prog}: error: {message} ({self.hint})\n")
