"""Where a CPU training step goes: forward, backward, optimizer step, and page faults, with and without the two
step-level changes of the worker (fused SGD, glibc told to keep freed blocks: tasks/allocator.py).

    python -m bench.step                 # ResNet-18, 32 px, batch 16 (the digits benchmark's shapes)
    python -m bench.step --size 64 --batch 32 --compile

Random tensors, no data loading: this is the ceiling the model and optimizer allow. Each variant runs in a
fresh process (the allocator settings are read at process start), in alternating repetitions.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import time

from bench.harness import Figure, alternate, in_fresh_process, table
from tasks.allocator import ENVIRONMENT, allocator_environment
from tasks.memory import peak_rss_mb

VARIANTS = {  # name: (fused optimizer, allocator settings, torch.compile)
    "default": (False, False, False),
    "fused SGD": (True, False, False),
    "kept blocks": (False, True, False),
    "fused SGD + kept blocks (ours)": (True, True, False),
}


def one_variant(fused: bool, compiled: bool, size: int, batch: int, steps: int, threads: int) -> dict:
    import torch
    import torchvision

    torch.set_num_threads(threads)
    torch.manual_seed(0)
    images, labels = torch.randn(batch, 3, size, size), torch.randint(0, 10, (batch,))
    model = torchvision.models.resnet18(num_classes=10).train()
    optimizer = torch.optim.SGD(
        model.parameters(),
        lr=0.01,
        momentum=0.9,
        nesterov=True,
        weight_decay=1e-4,
        **({"fused": True} if fused else {}),
    )
    forward = torch.compile(model) if compiled else model
    criterion = torch.nn.CrossEntropyLoss()
    times = [0.0, 0.0, 0.0]
    for step in range(steps + 5):  # 5 warm-up steps (and the compilation, when asked)
        if step == 5:
            times, faults, started = (
                [0.0, 0.0, 0.0],
                resource.getrusage(resource.RUSAGE_SELF).ru_minflt,
                time.perf_counter(),
            )
        t0 = time.perf_counter()
        loss = criterion(forward(images), labels)
        t1 = time.perf_counter()
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        t2 = time.perf_counter()
        optimizer.step()
        t3 = time.perf_counter()
        times = [times[0] + t1 - t0, times[1] + t2 - t1, times[2] + t3 - t2]
    elapsed = time.perf_counter() - started
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return {
        "images_per_s": batch * steps / elapsed,
        "ms": [round(t / steps * 1e3, 1) for t in times],
        "faults_per_step": (usage.ru_minflt - faults) / steps,
        "peak_mb": peak_rss_mb(),
    }


def run_variant(fused: bool, kept: bool, compiled: bool, size: int, batch: int, steps: int, threads: int) -> dict:
    plain = {k: v for k, v in os.environ.items() if k not in ENVIRONMENT}
    env = allocator_environment(plain) if kept else plain
    return json.loads(
        in_fresh_process("bench.step", "--one", json.dumps([fused, compiled, size, batch, steps, threads]), env=env)
    )


def figures(
    size: int = 32, batch: int = 16, steps: int = 60, repetitions: int = 3, compiled: bool = False
) -> list[Figure]:
    threads = os.cpu_count() or 1
    variants = {**VARIANTS, **({"ours + torch.compile": (True, True, True)} if compiled else {})}
    names = list(variants)
    records: dict[str, list[dict]] = {name: [] for name in names}

    def runner(name: str):
        def once() -> float:
            record = run_variant(*variants[name], size, batch, steps, threads)
            records[name].append(record)
            return record["images_per_s"]

        return once

    medians = alternate({name: runner(name) for name in names}, repetitions)
    for name in names:
        middle = sorted(records[name], key=lambda r: r["images_per_s"])[len(records[name]) // 2]
        print(
            f"{name:42s} {medians[name]:7.1f} images/s  forward/backward/optimizer {middle['ms']} ms/step  "
            f"{middle['faults_per_step']:8.0f} page faults/step  peak {middle['peak_mb']:.0f} MB",
            flush=True,
        )
    notes = (
        f"ResNet-18 @{size}px, batch {batch}, {threads} threads, random tensors, {repetitions} alternating repetitions"
    )
    return [
        Figure(
            f"training step ceiling: {name} vs default", medians[name], medians["default"], "images/s", "-", notes=notes
        )
        for name in names[1:]
    ]


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.step", description=__doc__.splitlines()[0])
    parser.add_argument("--size", type=int, default=32)
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--repetitions", type=int, default=3)
    parser.add_argument(
        "--compile", action="store_true", help="also the ours variant under torch.compile (slow to start)"
    )
    parser.add_argument("--one", help=argparse.SUPPRESS)  # a single variant, in this fresh process
    args = parser.parse_args()
    if args.one:
        print(json.dumps(one_variant(*json.loads(args.one))))
        return
    print(table(figures(args.size, args.batch, args.steps, args.repetitions, args.compile)))


if __name__ == "__main__":
    main()
