"""The monitor: the served version's recorded answers since a time, against the reference kept with it (class
shares, confidences, image properties, embeddings); the figures and pictures in the artifact ``model-drift``, and the
event ``image-classifier.model.drift`` when one passes its threshold (docs/monitoring.md).

    from flows.monitor import monitor_pipeline
    report = monitor_pipeline("digits-resnet18@production", records="records", since="1h")

    image-classifier monitor digits-resnet18@production --records records --since 1h
"""

from __future__ import annotations

from prefect import flow
from prefect.states import Completed

from flows.cli import checks
from tasks.monitoring.drift import ALPHA, MIN_RECORDS, DriftReport
from tasks.monitoring.prefect_tasks import monitor
from tasks.monitoring.window import check_look


@flow(name="monitor", log_prints=True)
def monitor_pipeline(
    model: str,
    records: str = "records",
    since: str = "1h",
    registry: str = "registry",
    validation: str | None = None,
    alpha: float = ALPHA,
    min_records: int = MIN_RECORDS,
    work_dir: str = "runs",
) -> DriftReport:
    """Measure the drift of the served version's recorded answers against its reference.

    Args:
        model: The served version: 'name@production', 'name/3' or 'name' (the latest); the records name it.
        records: The folder or s3://bucket/prefix the endpoint records into (serve --record).
        since: The window: a duration back from now (30m, 1h, 2d) or a time (2026-11-29T12:00:00Z).
        registry: Registry folder or s3://bucket/prefix that model resolves in.
        validation: For a version registered before references were kept: its validation ImageDirectory, once.
        alpha: The false-alarm rate of an unshifted window, shared among the figures (Bonferroni).
        min_records: Fewer records of the version in the window: no figures, one line saying so.
        work_dir: Folder for the command's log (logs/).
    """
    check_look(model, records, since, registry)
    report = monitor(model, records, since, registry, validation, alpha, min_records)
    return Completed(message=report.headline(), data=report)


@checks(monitor_pipeline)
def check_inputs(*, model: str, records: str, since: str, registry: str) -> None:
    check_look(model, records, since, registry)


def main(argv: list[str] | None = None, prog: str = "python -m flows.monitor") -> int:
    """Command line: a user's mistake (no such records folder, an unknown model, a bad --since) is one line and exit
    status 2; the log goes to <work-dir>/logs/monitor-<time>-<pid>.log."""
    from flows import cli

    report = cli.run_flow(monitor_pipeline, argv, prog=prog, check=check_inputs, log_name="monitor")
    print(report.headline())
    for figure in report.figures:
        verdict = "DRIFT" if figure.drifted else "ok"
        print(f"  {figure.name:<13} {figure.test:<26} {figure.statistic:10.4g}  p {figure.p_value:<9.3g} {verdict}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
