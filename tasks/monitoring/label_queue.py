"""``image-classifier label-queue MODEL --records DIR --out DIR --count N``: the recorded images the model was least
sure of (and with ``--unlike K`` the K farthest from the version's reference in the embeddings' space), for a person
to label: a folder per predicted class and ``queue.csv`` (sha256, predicted label, confidence, time, file, why).
Moving each wrong one into its right folder makes a labelled folder for the next training
(``image-classifier train … --labelled-data DIR``: labelled.py).

    image-classifier label-queue digits-resnet18 --records records --out to-label --count 200
    image-classifier label-queue digits-resnet18@production --records records --out to-label --since 7d --unlike 50

Only images whose bytes were recorded can be queued (``serve --record-images low-confidence`` or ``all``); each
image (sha256) once, with its least sure answer. Nothing is changed where the records are. Imports no Prefect, and
torch only for ``--unlike`` (the reference)."""

from __future__ import annotations

import io
import sys
from pathlib import Path

import numpy as np
import pandas as pd
from PIL import Image

from tasks.console import CommandParser
from tasks.contracts.image_files import class_folders
from tasks.contracts.registry_layout import parse_reference
from tasks.errors import PipelineInputError
from tasks.monitoring.records import RecordFolder, read_records
from tasks.monitoring.window import parse_since
from tasks.storage.s3 import read_s3_object

QUEUE_FILE = "queue.csv"
COUNT = 200


def least_sure(records: pd.DataFrame, count: int) -> pd.DataFrame:
    """The ``count`` records with stored images of least confidence, each sha256 once (its least sure answer)."""
    stored = records[records["image"].notna()]
    ordered = stored.sort_values(["confidence", "time"], kind="stable").drop_duplicates("sha256")
    return ordered.head(count).reset_index(drop=True)


def extension(data: bytes) -> str:
    """The file extension of an image's bytes (Pillow's name for its format): what conversion reads it by."""
    with Image.open(io.BytesIO(data)) as image:
        found = image.format
    return next((ext for ext, name in Image.registered_extensions().items() if name == found), ".img")


def image_bytes(records: str, relative: str) -> bytes:
    if RecordFolder(records).on_s3:
        data = read_s3_object(f"{records.rstrip('/')}/{relative}")
    else:
        path = Path(records) / relative
        data = path.read_bytes() if path.is_file() else None
    if data is None:
        raise PipelineInputError(f"{records}/{relative}: the recorded image is missing")
    return data


def most_unlike(records: pd.DataFrame, reference: np.ndarray, count: int) -> pd.DataFrame:
    """The ``count`` records with stored images whose embedding lies farthest from its nearest one of the
    reference's (each sha256 once): what the embeddings' drift test weighs most."""
    stored = records[records["image"].notna() & records["embedding"].notna()].drop_duplicates("sha256")
    if stored.empty or not count:
        return stored.head(0)
    window = np.stack(stored["embedding"].to_numpy()).astype(np.float64)
    squared = (window**2).sum(1)[:, None] + (reference.astype(np.float64) ** 2).sum(1)[None, :]
    nearest = np.maximum(squared - 2 * window @ reference.T, 0).min(axis=1)
    return stored.iloc[np.argsort(-nearest, kind="stable")[:count]]


def export_queue(
    model: str,
    records: str,
    out: str,
    count: int = COUNT,
    since: str | None = None,
    unlike: int = 0,
    registry: str = "registry",
) -> pd.DataFrame:
    """The ``count`` least sure recorded images of ``model`` (its name: every version's records), and the
    ``unlike`` ones farthest from the reference of the version ``model`` resolves to in ``registry``, into ``out``
    (new or empty); the queue's table."""
    if count < 1 or unlike < 0:
        raise PipelineInputError(f"count {count}, unlike {unlike}: give a count of at least 1, and unlike 0 or more")
    target = Path(out)
    if target.exists() and (not target.is_dir() or any(target.iterdir())):
        raise PipelineInputError(f"{out} already holds files: give a new or empty folder for the queue")
    name = parse_reference(model).name
    window = read_records(records, model=name, since=parse_since(since) if since else None)
    queue = least_sure(window.records, count).assign(why="least sure")
    if unlike:
        from tasks.monitoring.reference import version_reference  # torch, when a reference is computed

        reference, _ = version_reference(registry, model)
        others = window.records[~window.records["sha256"].isin(queue["sha256"])]
        queue = pd.concat([queue, most_unlike(others, reference.embeddings, unlike).assign(why="unlike the reference")])
    if queue.empty:
        stored = int(window.records["image"].notna().sum())
        raise PipelineInputError(
            f"{records} holds {len(window.records)} records of {name}, {stored} with their image: nothing to queue "
            "(serve with --record-images low-confidence or all to keep the images)"
        )
    folders, files = class_folders(sorted(queue["label"].unique())), []
    for row in queue.itertuples():
        data = image_bytes(records, row.image)
        path = target / folders[row.label] / f"{row.sha256[:16]}{extension(data)}"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)
        files.append(str(path.relative_to(target)))
    table = pd.DataFrame(
        {
            "sha256": queue["sha256"],
            "predicted label": queue["label"],
            "confidence": queue["confidence"],
            "time": queue["time"],
            "file": files,
            "why": queue["why"],
        }
    )
    table.to_csv(target / QUEUE_FILE, index=False)
    return table


def main(argv: list[str] | None = None, prog: str = "python -m tasks.monitoring.label_queue") -> int:
    parser = CommandParser(prog=prog, description=__doc__.split("\n\n")[0].replace("``", ""))
    parser.add_argument("model", metavar="MODEL", help="the served model: name, name/3 or name@alias")
    parser.add_argument("--records", default="records", help="the folder or s3://… serve --record writes to")
    parser.add_argument("--out", required=True, metavar="DIR", help="a new or empty folder for the queue")
    parser.add_argument("--count", type=int, default=COUNT, help=f"how many images ({COUNT})")
    parser.add_argument("--since", help="only records since: 30m, 1h, 7d or a time (all by default)")
    parser.add_argument(
        "--unlike", type=int, default=0, help="also this many images farthest from the version's reference (0)"
    )
    parser.add_argument("--registry", default="registry", help="where MODEL resolves, for --unlike")
    args = parser.parse_args(argv)
    try:
        table = export_queue(args.model, args.records, args.out, args.count, args.since, args.unlike, args.registry)
    except PipelineInputError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    counts = ", ".join(f"{label} {n}" for label, n in table["predicted label"].value_counts().sort_index().items())
    print(f"{len(table)} images queued in {args.out} ({counts}); {QUEUE_FILE} lists them")
    print(f"Move each wrong one into its right class folder, then train with --labelled-data {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
