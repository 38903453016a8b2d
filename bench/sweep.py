"""Hyperparameter sweeps (flows/sweep.py) on the bundled digits: random search without pruning against TPE with
ASHA pruning, the same trials, epochs and search space, one after the other on one Prefect server with two process
workers on the `gpu` pool (two "hosts" on this machine's cores), 2 trials at a time.

    python -m bench.sweep                      # 16 trials of up to 6 epochs each: about an hour on 2 cores
    python -m bench.sweep --trials 8 --epochs 4 --prune-after 1

For each: the best trial's validation top-1, the epochs trained in all (the compute), the wall time, the trials
pruned, and the overhead per trial (its flow run's start to its rank's first "training ..." line) against a plain
`train_pipeline` run's (flow start to the same line). Goal (issue 39): the same best top-1 within 0.5 points for
at most half the epochs.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench.fanout import seconds_to_training, training_started
from bench.harness import PROJECT_ROOT
from deployments.local import PrefectStack

SPACE = {
    "learning_rate": {"kind": "log_uniform", "low": 0.001, "high": 0.3},
    "batch_size": {"kind": "choice", "values": [16, 32, 64]},
    "weight_decay": {"kind": "log_uniform", "low": 1e-6, "high": 1e-2},
}
CONFIGS = {"random, no pruning": ("random", "none"), "TPE, ASHA": ("tpe", "asha")}  # pruned from --prune-after


def sweep(stack: PrefectStack, data: Path, work: Path, name: str, sampler: str, pruner: str, args) -> dict:
    from prefect.client.orchestration import get_client
    from prefect.settings import PREFECT_API_URL, temporary_settings

    from tasks.registry import read_registration

    command = [
        *(sys.executable, "-m", "flows.sweep", "--no-pretrained"),
        *("--train-data", str(data / "train"), "--validation-data", str(data / "validation")),
        *("--model-name", name, "--registry", str(work / "registry"), "--work-dir", str(work / "runs")),
        *("--epochs", str(args.epochs), "--patience", str(args.epochs), "--processes-per-node", "1"),
        *("--device", "cpu", "--trials", str(args.trials), "--parallel", "2", "--seed", str(args.seed)),
        *("--sampler", sampler, "--pruner", pruner, "--search-space", json.dumps(SPACE)),
        *("--prune-after", str(args.prune_after)),
    ]
    started = time.monotonic()
    subprocess.run(command, env=stack.env, cwd=PROJECT_ROOT, check=True, capture_output=True, timeout=6 * 3600)
    wall = time.monotonic() - started
    record = read_registration(work / "registry", name, 1).params["sweep"]
    trials = [t for t in record["trials"] if t["state"] != "abandoned"]
    overheads = []
    with temporary_settings({PREFECT_API_URL: stack.api_url}), get_client(sync_client=True) as client:
        for trial in trials:
            run = client.read_flow_run(trial["flow_run_id"])
            model_dir = Path(run.parameters["folders"]["output_dir"])
            if list((model_dir / "logs").glob("driver_log_*.txt")):
                overheads.append((training_started(model_dir) - run.start_time).total_seconds())
    best = max(t["value"] for t in trials if t["value"] is not None)
    return {
        "best top-1": best,
        "epochs trained": sum(t["epochs"] for t in trials),
        "wall s": wall,
        "pruned": sum(t["state"] == "pruned" for t in trials),
        "trial start to training s (median)": statistics.median(overheads),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--trials", type=int, default=16)
    parser.add_argument("--epochs", type=int, default=6)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--prune-after", type=int, default=2, help="epochs before a trial may be pruned")
    args = parser.parse_args()
    from tasks.data.datasets import export_digits

    results = {}
    with tempfile.TemporaryDirectory(prefix="bench-sweep-") as scratch:
        scratch = Path(scratch)
        export_digits(scratch / "data")
        with PrefectStack(home=scratch / "prefect", settings={"OMP_NUM_THREADS": "1"}) as stack:
            stack.deploy()
            for host in ("host-a", "host-b"):
                (scratch / host).mkdir()
                stack.start_worker("gpu", host, limit=1, cwd=scratch / host)
            plain = seconds_to_training(stack, scratch / "data", scratch / "plain", "plain", 1, 1)
            for n, (label, (sampler, pruner)) in enumerate(CONFIGS.items()):
                results[label] = sweep(
                    stack, scratch / "data", scratch / f"sweep-{n}", f"sweep-{n}", sampler, pruner, args
                )
                print(label, results[label], flush=True)
    print(
        f"\n{args.trials} trials of up to {args.epochs} epochs, 2 at a time, digits, seed {args.seed}, "
        f"pruned from epoch {args.prune_after}"
    )
    keys = list(next(iter(results.values())))
    print("| | " + " | ".join(keys) + " |\n|---|" + "---|" * len(keys))
    for label, figures in results.items():
        print(
            f"| {label} | "
            + " | ".join(f"{v:.4g}" if isinstance(v, float) else str(v) for v in figures.values())
            + " |"
        )
    random_side, tpe_side = results.values()
    print(
        f"TPE+ASHA vs random: best top-1 {100 * (tpe_side['best top-1'] - random_side['best top-1']):+.2f} points, "
        f"epochs {tpe_side['epochs trained'] / random_side['epochs trained']:.2f}x, "
        f"wall {tpe_side['wall s'] / random_side['wall s']:.2f}x; a plain train_pipeline's flow start to training "
        f"{plain:.1f} s"
    )


if __name__ == "__main__":
    main()
