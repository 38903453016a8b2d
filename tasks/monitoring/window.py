"""One look at the served model: the window of records since a time, of the version a reference names, measured
against that version's reference (drift.py). What the window leaves out (a damaged segment, another model's or
another version's records) is said, one line each. Imports no Prefect."""

from __future__ import annotations

import datetime as dt
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import pandas as pd

from tasks.contracts.registry_layout import parse_reference
from tasks.errors import PipelineInputError
from tasks.monitoring.drift import ALPHA, MIN_RECORDS, DriftReport, measure_drift
from tasks.monitoring.records import check_record_folder, read_records
from tasks.registry.core import Registry, resolve

if TYPE_CHECKING:
    from tasks.monitoring.reference import Reference

_UNITS = {"s": "s", "m": "min", "h": "h", "d": "D", "w": "W"}


@dataclass
class Look:
    report: DriftReport
    reference: Reference
    records: pd.DataFrame  # the window's records of the version
    left_out: list[str]  # what the window did not take, and why


def parse_since(since: str, now: dt.datetime | None = None) -> dt.datetime:
    """``30m``, ``1h``, ``2d`` (back from ``now``) or an ISO 8601 time (UTC when it names no zone)."""
    now = now or dt.datetime.now(dt.UTC)
    text = since.strip()
    try:
        if text[:1].isdigit() and text[-1:] in "smhdw" and text[:-1].replace(".", "", 1).isdigit():
            return now - pd.Timedelta(float(text[:-1]), unit=_UNITS[text[-1]]).to_pytimedelta()
        found = pd.Timestamp(text)
    except ValueError:
        found = None
    if found is None or pd.isna(found):
        raise PipelineInputError(
            f"since {since!r} is neither a duration (30m, 1h, 2d) nor a time (2026-11-29T12:00:00Z)"
        )
    return (found if found.tzinfo else found.tz_localize("UTC")).to_pydatetime()


def check_look(model: str, records: str, since: str, registry: Registry) -> None:
    """In seconds, before any work: the time, the version (a registered one: records name it), the records' folder."""
    parse_since(since)
    if Path(model).is_dir():
        raise PipelineInputError(
            f"{model} is a model folder: monitoring watches a registered version, which the records name "
            "(give name, name/3 or name@alias)"
        )
    resolve(registry, parse_reference(model))
    check_record_folder(records)


def look(
    model: str,
    records: str,
    since: str = "1h",
    registry: Registry = "registry",
    validation: str | None = None,
    alpha: float = ALPHA,
    min_records: int = MIN_RECORDS,
) -> Look:
    """The records at ``records`` since ``since`` answered by the version ``model`` resolves to (``name``,
    ``name/3``, ``name@production``), against its reference (``validation``: for a version registered before
    references were kept, once)."""
    if not 0 < alpha < 1:
        raise PipelineInputError(f"alpha {alpha}: give a false-alarm rate between 0 and 1 (e.g. 0.05)")
    if min_records < 2:
        raise PipelineInputError(f"min_records {min_records}: give at least 2")
    from tasks.monitoring.reference import version_reference  # torch, when a reference is computed

    check_look(model, records, since, registry)
    reference, registration = version_reference(registry, model, validation)
    window = read_records(records, model=registration.name, since=parse_since(since))
    found = window.records
    mine = found["version"] == registration.version
    left_out = [f"segment {name} skipped: {why}" for name, why in window.damaged.items()]
    if window.other_models:
        left_out.append(f"{window.other_models} records of other models left out")
    others = Counter(found.loc[~mine, "version"].tolist())
    if others:
        versions = ", ".join(f"{v}: {n}" for v, n in sorted(others.items()))
        left_out.append(
            f"{sum(others.values())} records of other versions of {registration.name} left out ({versions})"
        )
    found = found[mine].reset_index(drop=True)
    report = measure_drift(
        reference, found, registration.name, registration.version, alpha=alpha, min_records=min_records
    )
    return Look(report, reference, found, left_out)
