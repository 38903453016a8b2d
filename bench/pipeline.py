"""Orchestration overhead: `train_pipeline` against the same stages called as plain functions.

    python -m bench.pipeline                 # digits, 1 epoch, 1 process, 2 alternating repetitions

Both sides convert, validate, build the model spec, launch the same torchrun worker, score the validation
set, evaluate and register. The Prefect side runs on a real (temporary) Prefect server started before the
clock starts, as a deployment's runs would find one; it also draws the pictures and writes the artifacts.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

from bench.harness import Figure, alternate, table
from tasks.contracts.model_directory import ModelSpec
from tasks.contracts.training_config import TrainingFolders, TrainingParams
from tasks.convert.conversion import convert_to_image_directory
from tasks.data.datasets import export_digits
from tasks.data.validate import check_training_data
from tasks.evaluation.evaluate import evaluate_scores
from tasks.evaluation.score import score_images
from tasks.launch.torchrun_launcher import launch_training
from tasks.model.untrained import write_untrained_model_directory
from tasks.registry import lineage, register_model

PARAMS = TrainingParams(epochs=1, processes_per_node=1, device="cpu")


def plain_functions(train_source: Path, validation_source: Path, out: Path) -> None:
    train = convert_to_image_directory(train_source, out / "data" / "train")
    validation = convert_to_image_directory(validation_source, out / "data" / "validation")
    check_training_data(train, validation)
    spec = write_untrained_model_directory(out / "model_spec", ModelSpec())
    model_dir = launch_training(
        TrainingFolders(train.root, validation.root, spec, out / "model"), PARAMS, log=lambda level, line: None
    )
    scores = score_images(model_dir, validation)
    scores.to_csv(out / "scores.csv", index=False)
    evaluation = evaluate_scores(scores)
    register_model(
        out / "registry",
        "digits-resnet18",
        model_dir,
        metrics=evaluation.figures(),
        params=PARAMS.model_dump(),
        datasets={"train": lineage(train.root), "validation": lineage(validation.root)},
    )


def figures(repetitions: int = 2) -> list[Figure]:
    from prefect.testing.utilities import prefect_test_harness

    from flows.pipeline import train_pipeline

    with tempfile.TemporaryDirectory(prefix="bench-pipeline-") as scratch, prefect_test_harness():
        scratch = Path(scratch)
        train_source, validation_source = export_digits(scratch / "digits")
        counter = iter(range(10**6))

        def timed(run):
            def once() -> float:
                start = time.perf_counter()
                run(scratch / f"run-{next(counter)}")
                return time.perf_counter() - start

            return once

        medians = alternate(
            {
                "flow": timed(
                    lambda out: train_pipeline(
                        train_data=str(train_source),
                        validation_data=str(validation_source),
                        model=ModelSpec(pretrained=False),
                        training=PARAMS,
                        registry=str(out / "registry"),
                        work_dir=str(out),
                    )
                ),
                "plain": timed(lambda out: plain_functions(train_source, validation_source, out)),
            },
            repetitions,
        )
    overhead = medians["flow"] - medians["plain"]
    return [
        Figure(
            "pipeline wall time: train_pipeline vs plain functions",
            medians["flow"],
            medians["plain"],
            "s",
            "<= 1.10x or <= 5 s more",
            1.10,
            higher_is_better=False,
            allowance=5.0,
            notes=f"overhead {overhead:+.1f} s; digits, 1 epoch, 1 process; {repetitions} alternating repetitions",
        )
    ]


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repetitions", type=int, default=2)
    print(table(figures(parser.parse_args().repetitions)))
