"""``python -m tasks.registry`` moved: the registry's command line is ``image-classifier registry`` (or
``python -m flows.registry``). This name says so in one line and exits 2, as the old ``from tasks import …`` names
raise an ImportError naming their new place; nothing in tasks/ imports flows/."""

from __future__ import annotations

import sys

MOVED = (
    "python -m tasks.registry: moved; the registry's command line is `image-classifier registry …` "
    "(or `python -m flows.registry …`), with the same arguments"
)

if __name__ == "__main__":
    print(MOVED, file=sys.stderr)
    sys.exit(2)
