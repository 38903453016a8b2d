"""Training speed, memory and time to accuracy on the bundled digits, on this machine's CPU.

    python -m bench.train                  # all three figures (about 4 minutes on 2 cores)
    python -m bench.train --repetitions 3

* training images/s: our torchrun worker (1 process, every CPU thread) against the loop one would write by
  hand — torchvision ImageFolder + DataLoader + PIL, the same ResNet-18, data, transforms, batch size,
  optimizer and threads — alternating, median of the second epoch of each run (the first warms caches);
* peak memory of each training process (the worker logs its peak RSS);
* time to accuracy: seconds from launch until validation top-1 first reaches 98%, with `make run`'s
  settings (Azure defaults, 2 processes, DDP over Gloo).
"""

from __future__ import annotations

import argparse
import os
import re
import tempfile
import time
from pathlib import Path

import torch
import torchvision
from torch.utils.data import DataLoader
from torchvision import transforms as T

from bench.harness import Figure, alternate, in_fresh_process, table
from tasks.contracts.model_directory import ModelSpec, driver_log_path
from tasks.contracts.training_config import TrainingFolders, TrainingParams
from tasks.convert.conversion import convert_to_image_directory
from tasks.data.datasets import export_digits
from tasks.launch.torchrun_launcher import launch_training, worker_environment
from tasks.model.untrained import write_untrained_model_directory

IMAGE_SIZE = 32
_PEAK = re.compile(r"peak memory (\d+) MB")


def digits(scratch: Path) -> tuple[Path, Path, Path, Path]:
    """(train source, validation source, train ImageDirectory, validation ImageDirectory)."""
    train_src, val_src = export_digits(scratch / "digits")
    train = convert_to_image_directory(train_src, scratch / "train").root
    val = convert_to_image_directory(val_src, scratch / "validation").root
    return train_src, val_src, train, val


def run_worker(train: Path, val: Path, spec: Path, output: Path, params: TrainingParams, on_metrics=None):
    options = {"on_metrics": on_metrics} if on_metrics else {}
    return launch_training(TrainingFolders(train, val, spec, output), params, log=lambda level, line: None, **options)


def plain_loop_images_per_s(train_source: Path, params: TrainingParams, epochs: int = 2) -> float:
    """The hand-written baseline with the same thread count as the worker gets (run in its own process: see
    ``plain_loop_in_subprocess``)."""
    torch.set_num_threads(int(worker_environment(params)["OMP_NUM_THREADS"]))
    torch.manual_seed(params.random_seed)
    # Written the usual way, on PIL images; it computes exactly what our train_transform does
    # (tests/training/test_data.py checks that they agree to the bit).
    transform = T.Compose(
        [
            T.Resize((IMAGE_SIZE, IMAGE_SIZE)),
            T.RandomCrop(IMAGE_SIZE, padding=IMAGE_SIZE // 8, padding_mode="edge"),
            T.ToTensor(),
            T.Normalize((0.485, 0.456, 0.406), (0.229, 0.224, 0.225)),
        ]
    )
    dataset = torchvision.datasets.ImageFolder(str(train_source), transform=transform)
    loader = DataLoader(dataset, batch_size=params.batch_size, shuffle=True)
    model = torchvision.models.resnet18(num_classes=len(dataset.classes))
    optimizer = torch.optim.SGD(
        model.parameters(), lr=params.learning_rate, momentum=0.9, nesterov=True, weight_decay=1e-4
    )
    criterion = torch.nn.CrossEntropyLoss()
    for _ in range(epochs):
        model.train()
        start, seen = time.perf_counter(), 0
        for images, labels in loader:
            loss = criterion(model(images), labels)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            seen += labels.size(0)
        rate = seen / (time.perf_counter() - start)
    return rate


def plain_loop_in_subprocess(train_source: Path, params: TrainingParams) -> float:
    """The baseline in a fresh process, like the worker: run in this one, its OpenMP threads would keep
    spinning after it returns and steal the cores from the next worker (measured: ours 0.70x instead of ~1x)."""
    return float(
        in_fresh_process("bench.train", "--plain-loop", str(train_source), "--batch-size", str(params.batch_size))
    )


def figures(repetitions: int = 3) -> list[Figure]:
    results = []
    with tempfile.TemporaryDirectory(prefix="bench-train-") as scratch:
        scratch = Path(scratch)
        train_src, _, train, val = digits(scratch)
        spec = write_untrained_model_directory(scratch / "spec", ModelSpec(architecture="resnet18"))
        single = TrainingParams(epochs=2, processes_per_node=1, device="cpu", image_size=IMAGE_SIZE)
        counter = iter(range(10**6))
        peaks: list[int] = []

        def ours() -> float:
            output = scratch / f"ours-{next(counter)}"
            model_dir = run_worker(train, val, spec, output, single)
            peaks.extend(int(m) for m in _PEAK.findall(driver_log_path(output, 0).read_text()))
            return model_dir.metrics().epochs[-1].train_images_per_s

        medians = alternate({"ours": ours, "plain": lambda: plain_loop_in_subprocess(train_src, single)}, repetitions)
        results.append(
            Figure(
                "training (ResNet-18, digits @32px, 1 process)",
                medians["ours"],
                medians["plain"],
                "images/s",
                ">= 1.3x ImageFolder + DataLoader + PIL",
                1.3,
                notes=f"batch {single.batch_size}, {worker_environment(single)['OMP_NUM_THREADS']} threads, "
                f"{repetitions} alternating repetitions, median of epoch 2",
            )
        )

        make_run = TrainingParams(epochs=15, patience=15, processes_per_node=2, device="cpu")
        output = scratch / "time-to-accuracy"
        reached: list[float] = []
        launched = time.monotonic()

        def watch(metrics) -> None:
            if not reached and metrics.epochs and metrics.epochs[-1].top1 >= 0.98:
                reached.append(time.monotonic() - launched)

        model_dir = run_worker(train, val, spec, output, make_run, on_metrics=watch)
        epochs = model_dir.metrics().epochs
        first = next((e.epoch for e in epochs if e.top1 >= 0.98), None)
        results.append(
            Figure(
                "time to 98% validation top-1 (digits, make run settings)",
                reached[0] if reached else float("nan"),
                None,
                "s",
                "-",
                notes=f"reached at epoch {first} of {len(epochs)}"
                if first
                else f"not reached in {len(epochs)} epochs (best {max(e.top1 for e in epochs):.4f})",
                higher_is_better=False,
            )
        )
        for rank in (0, 1):
            peaks.extend(int(m) for m in _PEAK.findall(driver_log_path(output, rank).read_text()))
        results.append(
            Figure(
                "peak memory per training process",
                float(max(peaks)),
                None,
                "MB",
                "-",
                higher_is_better=False,
                notes=f"RSS of each worker process, {len(peaks)} processes measured, {os.cpu_count()} CPUs",
            )
        )
    return results


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repetitions", type=int, default=3)
    parser.add_argument("--plain-loop", type=Path, help="only run the baseline on this class-per-folder source")
    parser.add_argument("--batch-size", type=int, default=TrainingParams().batch_size)
    args = parser.parse_args()
    if args.plain_loop:
        params = TrainingParams(processes_per_node=1, batch_size=args.batch_size)
        print(plain_loop_images_per_s(args.plain_loop, params))
    else:
        print(table(figures(args.repetitions)))
