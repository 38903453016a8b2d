"""The cost of launching the nodes through the work pool: seconds from the pipeline flow's start to every rank
training, with nodes=2 (one flow run per node, each picked up by a worker of the `gpu` pool) against nodes=1 (the
train task launches torchrun itself), alternating, on one Prefect server.

    python -m bench.fanout                   # bundled digits, 1 epoch, 1 process per node, 2 repetitions each

Both sides run `python -m flows.pipeline` as a person does, against a real server with the deployments of
deployments/prefect.yaml and two process workers (each in a folder of its own, as on two hosts), so both pay the
same flow start and conversion; the difference is the fan-out: submitting the node runs, the workers starting
them, the rendezvous. "Training" is each rank's "training <architecture> on ..." log line, written once its
process group is formed and its data loaded, just before the first batch.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
from datetime import datetime
from pathlib import Path

from bench.harness import PROJECT_ROOT, Figure, alternate, table
from deployments.local import PrefectStack

TRAINING_LINE = "] INFO training "


def training_started(model_dir: Path) -> datetime:
    """When the last rank began training: the latest of the ranks' "training ..." lines (local time)."""
    times = []
    for log in sorted((model_dir / "logs").glob("driver_log_*.txt")):
        line = next(line for line in log.read_text().splitlines() if TRAINING_LINE in line)
        times.append(datetime.strptime(line[:23], "%Y-%m-%d %H:%M:%S,%f").astimezone())
    return max(times)


def seconds_to_training(stack: PrefectStack, data: Path, work: Path, name: str, nodes: int, epochs: int) -> float:
    from prefect.client.orchestration import get_client
    from prefect.settings import PREFECT_API_URL, temporary_settings

    from tasks.registry import read_registration

    command = [
        sys.executable,
        "-m",
        "flows.pipeline",
        "--no-pretrained",
        "--train-data",
        str(data / "train"),
        "--validation-data",
        str(data / "validation"),
        "--model-name",
        name,
        "--registry",
        str(work / "registry"),
        "--work-dir",
        str(work / "runs"),
        "--epochs",
        str(epochs),
        "--processes-per-node",
        "1",
        "--device",
        "cpu",
        "--nodes",
        str(nodes),
    ]
    subprocess.run(command, env=stack.env, cwd=PROJECT_ROOT, check=True, capture_output=True, timeout=900)
    registration = read_registration(work / "registry", name, 1)
    with temporary_settings({PREFECT_API_URL: stack.api_url}), get_client(sync_client=True) as client:
        started = client.read_flow_run(registration.flow_run_id).start_time
    (model_dir,) = (work / "runs").glob(f"*-{str(registration.flow_run_id)[:8]}/model")
    return (training_started(model_dir) - started).total_seconds()


def figures(repetitions: int = 2, epochs: int = 1) -> list[Figure]:
    from tasks.data.datasets import export_digits

    with tempfile.TemporaryDirectory(prefix="bench-fanout-") as scratch:
        scratch = Path(scratch)
        export_digits(scratch / "data")
        # Two "hosts" on one machine's cores: one compute thread per training process, as in the tests.
        settings = {"OMP_NUM_THREADS": "1"}
        with PrefectStack(home=scratch / "prefect", settings=settings) as stack:
            stack.deploy()
            for host in ("host-a", "host-b"):
                (scratch / host).mkdir()
                stack.start_worker("gpu", host, limit=1, cwd=scratch / host)
            runs = iter(range(10**6))

            def side(nodes: int):
                return lambda: seconds_to_training(
                    stack, scratch / "data", scratch / f"run-{next(runs)}", f"fanout-{nodes}", nodes, epochs
                )

            medians = alternate({"single": side(1), "nodes": side(2)}, repetitions)
    return [
        Figure(
            name="flow start to all ranks training, nodes=2 via the pool",
            ours=medians["nodes"],
            baseline=medians["single"],
            unit="s",
            target="fan-out cost, measured",
            higher_is_better=False,
            notes=f"digits, {epochs} epoch, 1 process per node, 2 process workers; median of {repetitions}; "
            f"fan-out cost {medians['nodes'] - medians['single']:.1f} s",
        )
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repetitions", type=int, default=2)
    args = parser.parse_args()
    (figure,) = figures(args.repetitions)
    print(table([figure]))
    print(f"nodes=2 {figure.ours:.1f} s, nodes=1 {figure.baseline:.1f} s: ratio {figure.ratio:.2f}x, {figure.notes}")


if __name__ == "__main__":
    main()
