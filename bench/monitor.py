"""The watched model end to end, in one run (issue 63, item 6): train on the digits, serve the version with every
answer recorded, send unshifted traffic then a shifted stream the model is weak on (the same digits, inverted:
dark strokes on light paper), and measure what the monitoring does with it.

- **False alarms**: the unshifted records cut into consecutive windows of ``--window`` records, each measured
  against the version's reference (``tasks.monitoring.drift.measure_drift``, what the monitor flow runs): the share
  that says drift (goal <= 5%).
- **Detection delay**: after the shift, a window of the last ``--window`` records looked at every ``--step``
  requests: how many shifted requests until one says drift (goal <= 300).
- **Retraining on the event**: the monitor flow (``flows.monitor.monitor_pipeline``) on the shifted records, on a
  real Prefect server with the retraining automation ``make deploy`` creates (deployments/automations.py): the
  drift event it emits and the run of the training deployment the automation creates, with no step of ours between.
  That run is not executed here (no worker): the retraining measured below is the same flow run by this script.
- **Top-1 back after labelling**: the ``--queue`` least sure shifted images (``label-queue``'s export), sorted into
  their true class folders (the person's step, played with the digits' own labels), added with
  ``--labelled-data`` to a second training of the same settings that starts from the production version's weights
  (``--warm-start``, as the labelled-batch automation runs it); top-1 on shifted images that were not labelled,
  before and after (goal: within 2 points of the unshifted top-1).

The recording's cost on serving is measured by bench/serve.py (its "recording" row). The traffic comes from digits
held out of training and validation (a third split); requests are sent 8 at a time. Prints one table; writes
``bench/results/<date>-monitor-<host>.json``. Asserts nothing.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import datetime as dt
import io
import json
import os
import platform
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
from PIL import Image

from bench.harness import PROJECT_ROOT, Figure

NAME = "digits-watch"
SHIFT = "inverted"


def digits_three_ways(root: Path, seed: int) -> tuple[Path, Path, list[tuple[bytes, int]]]:
    """The digits as PNG class folders: train (60%) and validation (20%); the held-out 20% as (png, label)."""
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split

    digits = load_digits()
    pixels = np.rint(digits.images * (255 / 16)).astype(np.uint8)
    everything = np.arange(len(digits.target))
    train, rest = train_test_split(everything, test_size=0.4, stratify=digits.target, random_state=seed)
    validation, held_out = train_test_split(rest, test_size=0.5, stratify=digits.target[rest], random_state=seed)
    for split, indices in (("train", train), ("validation", validation)):
        for i in indices:
            folder = root / split / str(digits.target[i])
            folder.mkdir(parents=True, exist_ok=True)
            Image.fromarray(pixels[i], mode="L").save(folder / f"digit_{i:04d}.png")
    return root / "train", root / "validation", [(png(pixels[i]), int(digits.target[i])) for i in held_out]


def png(array: np.ndarray) -> bytes:
    buffer = io.BytesIO()
    Image.fromarray(array, mode="L").save(buffer, format="PNG")
    return buffer.getvalue()


def shifted(image: bytes) -> bytes:
    with Image.open(io.BytesIO(image)) as opened:
        return png(255 - np.asarray(opened))


def train(
    env: dict,
    work: Path,
    data: tuple[Path, Path],
    epochs: int,
    labelled: Path | None = None,
    share: float | None = None,
) -> float:
    """One run of the training pipeline (a new version of NAME); its seconds."""
    command = [sys.executable, "-m", "flows.pipeline", "--no-pretrained", "--model-name", NAME]
    command += ["--train-data", str(data[0]), "--validation-data", str(data[1]), "--epochs", str(epochs)]
    command += ["--registry", str(work / "registry"), "--work-dir", str(work / "runs"), "--promote-to", "production"]
    # As the labelled-batch automation runs it: from the production version's weights (deployments/automations.py).
    command += ["--labelled-data", str(labelled), "--warm-start", f"{NAME}@production"] if labelled else []
    command += ["--labelled-share", str(share)] if labelled and share is not None else []
    started = time.monotonic()
    done = subprocess.run(command, env=env, cwd=PROJECT_ROOT, capture_output=True, text=True, timeout=3600)
    if done.returncode != 0:
        raise RuntimeError(f"training failed:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}")
    return time.monotonic() - started


def serve(env: dict, work: Path, port: int) -> subprocess.Popen:
    command = [sys.executable, "-m", "tasks.serving", f"{NAME}@production", "--registry", str(work / "registry")]
    command += ["--port", str(port), "--record", str(work / "records"), "--record-images", "all"]
    command += ["--record-segment-s", "1", "--log-level", "warning"]
    log = open(work / "serve.log", "ab")
    process = subprocess.Popen(command, env=env, cwd=PROJECT_ROOT, stdout=log, stderr=subprocess.STDOUT)
    log.close()
    return process


def wait_ready(url: str, process: subprocess.Popen, timeout: float = 300) -> None:
    import httpx

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"the endpoint exited with status {process.returncode}: see its serve.log")
        try:
            if httpx.get(f"{url}/readyz", timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.5)
    raise RuntimeError("the endpoint was not ready in time")


def send(url: str, images: list[bytes]) -> None:
    """Each image once, 8 requests at a time, in order of submission (answers are recorded as they come)."""
    import httpx

    with httpx.Client(timeout=60) as client, concurrent.futures.ThreadPoolExecutor(8) as pool:

        def one(image: bytes) -> None:
            answer = client.post(f"{url}/v1/predict", content=image, headers={"Content-Type": "image/png"})
            answer.raise_for_status()

        list(pool.map(one, images))


def read_all(records: Path):
    from tasks.monitoring.records import read_records

    window = read_records(str(records), model=NAME)
    return window.records.sort_values("time", kind="stable").reset_index(drop=True)


def top1(model, images: list[tuple[bytes, int]]) -> float:
    decoded = [model.decode(image) for image, _ in images]
    labels = np.array([int(model.classes[i]) for i in model.probabilities(decoded).argmax(axis=1)])
    return float((labels == np.array([label for _, label in images])).mean())


def drift_run(stack, deployment_id: str, records: Path, since: str, registry: Path) -> dict:
    """The monitor flow on the shifted records against the server; the drift event and the training run the
    automation creates."""
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import DeploymentFilter, DeploymentFilterId
    from prefect.settings import PREFECT_API_URL, temporary_settings

    from deployments.automations import retrain_automation
    from flows.monitor import monitor_pipeline
    from tasks.monitoring.events import DRIFT_EVENT

    with temporary_settings({PREFECT_API_URL: stack.api_url}):
        automation = retrain_automation(deployment_id).create()
        started = time.monotonic()
        report = monitor_pipeline(NAME + "@production", str(records), since, str(registry))
        with get_client(sync_client=True) as client:
            only = DeploymentFilter(id=DeploymentFilterId(any_=[deployment_id]))
            while not (runs := client.read_flow_runs(deployment_filter=only)) and time.monotonic() - started < 300:
                time.sleep(1)
            events = []  # stored a moment after the automation has acted on it
            while not events and time.monotonic() - started < 300:
                events = client._client.post(
                    "/events/filter", json={"filter": {"event": {"name": [DRIFT_EVENT]}}, "limit": 5}
                ).json()["events"]
                time.sleep(0 if events else 1)
    return {
        "monitor": report.headline(),
        "drift_events": len(events),
        "automation": automation.name,
        "training_runs_created": len(runs),
        "seconds_from_monitor_start_to_run": round(time.monotonic() - started, 1) if runs else None,
        "run_state": runs[0].state.name if runs else None,
        "run_created_by": (runs[0].created_by.display_value if runs and runs[0].created_by else None),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.monitor", description=__doc__.split("\n\n")[0])
    parser.add_argument("--window", type=int, default=100, help="records per window (100: the monitor's minimum)")
    parser.add_argument("--windows", type=int, default=20, help="unshifted windows, for the false alarms (20)")
    parser.add_argument("--step", type=int, default=20, help="shifted requests between two looks (20)")
    parser.add_argument("--shifted", type=int, default=400, help="shifted requests sent (400)")
    parser.add_argument("--queue", type=int, default=200, help="images queued for labelling (200)")
    parser.add_argument("--epochs", type=int, default=5, help="epochs of each training (5: make run's)")
    parser.add_argument(
        "--labelled-share", type=float, help="the retraining's labelled_share (empty: TrainingParams' default)"
    )
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--output", help="the JSON results (default bench/results/<date>-monitor-<host>.json)")
    args = parser.parse_args(argv)

    from deployments.local import PrefectStack, free_port
    from tasks.inference.loaded import LoadedModel
    from tasks.monitoring.drift import measure_drift
    from tasks.monitoring.label_queue import export_queue
    from tasks.monitoring.reference import version_reference

    rng = np.random.default_rng(args.seed)
    work = Path(tempfile.mkdtemp(prefix="bench-monitor-"))
    results: dict = {"settings": vars(args), "shift": SHIFT}
    print(f"bench.monitor: work folder {work}", flush=True)
    try:
        with PrefectStack(home=work / "prefect") as stack:
            env = {**stack.env, "OMP_NUM_THREADS": "1"}
            train_dir, validation_dir, held_out = digits_three_ways(work / "digits", args.seed)
            results["training_s"] = [round(train(env, work, (train_dir, validation_dir), args.epochs), 1)]
            registry = work / "registry"
            print(f"  trained {NAME}/1 in {results['training_s'][0]} s", flush=True)

            port = free_port()
            url = f"http://127.0.0.1:{port}"
            endpoint = serve(env, work, port)
            try:
                wait_ready(url, endpoint)
                calm = [held_out[i] for i in rng.integers(len(held_out), size=args.window * args.windows)]
                send(url, [image for image, _ in calm])
                shift_started = dt.datetime.now(dt.UTC)
                order = rng.permutation(len(held_out))
                stream = [(shifted(held_out[i][0]), held_out[i][1]) for i in order]
                stream = [stream[i % len(stream)] for i in range(args.shifted)]
                send(url, [image for image, _ in stream])
            finally:
                endpoint.send_signal(signal.SIGTERM)  # drains; the recorder publishes what it holds
                endpoint.wait(60)
            records = read_all(work / "records")  # in the order they were answered
            truth = {hashlib_sha256(image): label for image, label in held_out}
            moved = {hashlib_sha256(image): label for image, label in stream}
            records["truth"] = records["sha256"].map(truth | moved)
            records["shifted"] = records["sha256"].isin(moved.keys())
            calm_records = records[~records["shifted"]]
            shifted_at = np.flatnonzero(records["shifted"].to_numpy())  # each shifted record's place
            results["records"] = {"unshifted": len(calm_records), "shifted": len(shifted_at)}

            reference, registration = version_reference(str(registry), f"{NAME}@production")

            def drifts(window) -> list[str]:
                """The figures that say the window drifted (none: no drift)."""
                report = measure_drift(reference, window, NAME, registration.version, seed=int(rng.integers(1 << 31)))
                return [figure.name for figure in report.drifted]

            windows = len(calm_records) // args.window
            alarms = [drifts(calm_records.iloc[i * args.window : (i + 1) * args.window]) for i in range(windows)]
            delay = None  # shifted requests answered when a window of the last ones first says drift
            for seen in range(args.step, len(shifted_at) + 1, args.step):
                end = shifted_at[seen - 1] + 1
                if drifts(records.iloc[max(0, end - args.window) : end]):
                    delay = seen
                    break
            results["false_alarms"] = {
                "windows": len(alarms),
                "drifted": sum(map(bool, alarms)),
                "figures": [names for names in alarms if names],
            }
            results["detection_delay_requests"] = delay
            print(
                f"  false alarms {results['false_alarms']['drifted']} of {len(alarms)} windows "
                f"{results['false_alarms']['figures']}; drift seen after {delay} shifted requests"
            )

            deployment_id = make_training_deployment(stack)
            results["retraining"] = drift_run(
                stack, deployment_id, work / "records", shift_started.isoformat(), registry
            )
            print(f"  retraining: {results['retraining']}", flush=True)

            queue_dir, sorted_dir = work / "queue", work / "labelled"
            table = export_queue(NAME, str(work / "records"), str(queue_dir), args.queue, shift_started.isoformat())
            for row in table.itertuples():  # the person's step: each image into its true class folder
                target = sorted_dir / str(moved[row.sha256]) / Path(row.file).name
                target.parent.mkdir(parents=True, exist_ok=True)
                shutil.copy(queue_dir / row.file, target)
            labelled = set(table["sha256"])
            results["queued"] = len(table)
            results["training_s"].append(
                round(train(env, work, (train_dir, validation_dir), args.epochs, sorted_dir, args.labelled_share), 1)
            )
            unseen = [(shifted(image), label) for image, label in held_out]
            unseen = [(image, label) for image, label in unseen if hashlib_sha256(image) not in labelled]
            top = {}
            for version in (1, 2):
                model = LoadedModel.load(f"{NAME}/{version}", str(registry))
                top[version] = {"unshifted": top1(model, held_out), "shifted": top1(model, unseen)}
            results["top1"] = top
            results["shifted_images_scored"] = len(unseen)
    finally:
        shutil.rmtree(work, ignore_errors=True)

    alarm_rate = results["false_alarms"]["drifted"] / results["false_alarms"]["windows"]
    figures = [
        Figure(
            "false alarms, unshifted windows",
            alarm_rate,
            None,
            "share",
            "<= 5%",
            0.05,
            higher_is_better=False,
            notes=f"{results['false_alarms']['drifted']} of {results['false_alarms']['windows']} windows of {args.window}",
        ),
        Figure(
            "detection delay after the shift",
            results["detection_delay_requests"] or float("inf"),
            None,
            "requests",
            "<= 300",
            300,
            higher_is_better=False,
            notes=f"a look every {args.step} requests",
        ),
        Figure(
            "training runs the drift event started",
            results["retraining"]["training_runs_created"],
            None,
            "runs",
            ">= 1 (no step of ours)",
            1,
        ),
        Figure(
            "top-1 on the shifted stream after labelling",
            top[2]["shifted"],
            top[1]["unshifted"],
            "top-1",
            "within 2 points of unshifted top-1",
            1.0,
            allowance=0.02,
            notes=f"before labelling {top[1]['shifted']:.4f}; {results['queued']} images labelled",
        ),
    ]
    results["figures"] = [figure.as_dict() for figure in figures]
    print(
        "\nfigure                                        ours       baseline   target                               met"
    )
    for f in figures:
        base = "-" if f.baseline is None else f"{f.baseline:.4f}"
        print(f"{f.name:45} {f.ours:<10.4g} {base:10} {f.target:36} {'yes' if f.met else 'NO'}  {f.notes}")
    results["date"] = dt.datetime.now(dt.UTC).isoformat()
    results["machine"] = {"host": platform.node(), "cpus": os.cpu_count()}
    results["command"] = ["python", "-m", "bench.monitor", *(argv if argv is not None else sys.argv[1:])]
    output = Path(
        args.output or PROJECT_ROOT / "bench" / "results" / f"{dt.date.today()}-monitor-{platform.node()}.json"
    )
    output.write_text(json.dumps(results, indent=1, default=str) + "\n")
    print(f"wrote {output}")
    return 0


def hashlib_sha256(data: bytes) -> str:
    import hashlib

    return hashlib.sha256(data).hexdigest()


def make_training_deployment(stack) -> str:
    """A deployment of the training flow on the server (what make deploy's retrain-digits is to the automation)."""
    from prefect.client.orchestration import get_client
    from prefect.settings import PREFECT_API_URL, temporary_settings

    with temporary_settings({PREFECT_API_URL: stack.api_url}), get_client(sync_client=True) as client:
        flow_id = client.create_flow_from_name("train-pipeline")
        return str(client.create_deployment(flow_id, "retrain-digits"))


if __name__ == "__main__":
    sys.exit(main())
