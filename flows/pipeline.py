"""The training pipeline: convert -> validate -> build model -> train -> score -> evaluate -> register.

    from flows.pipeline import train_pipeline
    result = train_pipeline()                         # bundled digits, Azure defaults
    print(result.summary())

    python -m flows.pipeline --processes-per-node 2   # the same from a shell (what `make run` does)
"""

from __future__ import annotations

from pathlib import Path
from prefect import flow
from prefect.runtime import flow_run
from pydantic import BaseModel

from tasks.convert import convert
from tasks.datasets import sources
from tasks.evaluate import Evaluation, evaluate
from tasks.model import build_model_directory
from tasks.model_directory import ModelSpec
from tasks.registry import Registration, register
from tasks.score import score
from tasks.train import train
from tasks.training.config import TrainingParams
from tasks.validate import validate_labels


class PipelineResult(BaseModel):
    model_name: str
    version: int
    location: str
    run_dir: str
    evaluation: Evaluation
    registration: Registration

    @property
    def top1(self) -> float:
        return self.registration.metrics["best_top1"]

    def summary(self) -> str:
        e, m = self.evaluation, self.registration.metrics
        auc = "n/a" if e.auc_ovr is None else f"{e.auc_ovr:.4f}"
        return "\n".join(
            [
                f"Registered {self.model_name} version {self.version} in {self.location}",
                f"  validation top-1 {self.top1:.4f} (best epoch {m['best_epoch']} of {m['epochs_trained']})",
                f"  accuracy {e.accuracy:.4f}, precision {e.precision_macro:.4f}, recall {e.recall_macro:.4f}, "
                f"F1 {e.f1_macro:.4f}, AUC {auc} (macro, {e.images} validation images)",
                f"  run files (data, model, logs, scores): {self.run_dir}",
            ]
        )


@flow(name="train-pipeline", log_prints=True)
def train_pipeline(
    train_data: str | None = None,
    validation_data: str | None = None,
    model: ModelSpec = ModelSpec(),
    training: TrainingParams = TrainingParams(),
    model_name: str | None = None,
    registry: str = "registry",
    work_dir: str = "runs",
) -> PipelineResult:
    """Train an image classifier from class-per-folder images, evaluate it and register it.

    Args:
        train_data: Class-per-folder folder or .zip of training images (cat/1.jpg, dog/2.jpg, ...); empty: the bundled digits.
        validation_data: Validation images with the same classes; empty: the bundled digits.
        model: The torchvision architecture and its options (Azure's DenseNet / ResNet modules).
        training: Training parameters; defaults are Azure's "Train PyTorch Model" component's.
        model_name: Registry name; empty: '<data set>-<architecture>', e.g. digits-resnet18.
        registry: Registry folder.
        work_dir: Folder for each run's converted data, model, logs and scores.
    """
    # Named after the flow run, so that a retried run finds its checkpoints again.
    run_dir = Path(work_dir).resolve() / f"{flow_run.get_name()}-{flow_run.get_id()[:8]}"
    train_source, validation_source = sources(train_data, validation_data, work_dir)
    train_dir = convert(train_source, str(run_dir / "data" / "train"), "train")
    validation_dir = convert(validation_source, str(run_dir / "data" / "validation"), "validation")
    validate_labels(train_dir, validation_dir)
    spec_dir = build_model_directory(str(run_dir / "model_spec"), model)
    model_dir = train(train_dir, validation_dir, spec_dir, str(run_dir / "model"), training)
    evaluation = evaluate(score(model_dir, validation_dir, str(run_dir / "scores.csv")))
    registered = register(
        registry,
        model_name,
        model_dir,
        evaluation,
        datasets={"train": train_dir, "validation": validation_dir},
        params={"model": model.model_dump(), "training": training.model_dump()},
    )
    return PipelineResult(
        model_name=registered.registration.name,
        version=registered.registration.version,
        location=registered.location,
        run_dir=str(run_dir),
        evaluation=evaluation,
        registration=registered.registration,
    )


def main(argv: list[str] | None = None) -> PipelineResult:
    """Command line: the flow's parameters as flags (training flags as the worker's)."""
    import argparse

    from tasks.training.config import add_training_flags, params_from_flags

    parser = argparse.ArgumentParser(prog="python -m flows.pipeline", description=train_pipeline.description)
    parser.add_argument("--train-data", help="class-per-folder folder or .zip (default: bundled digits)")
    parser.add_argument("--validation-data", help="validation images with the same classes")
    parser.add_argument("--architecture", default=ModelSpec().architecture, help="torchvision model name")
    parser.add_argument("--model-name", help="registry name (default: <data set>-<architecture>)")
    parser.add_argument("--registry", default="registry")
    parser.add_argument("--work-dir", default="runs")
    add_training_flags(parser)
    args = parser.parse_args(argv)
    result = train_pipeline(
        train_data=args.train_data,
        validation_data=args.validation_data,
        model=ModelSpec(architecture=args.architecture),
        training=params_from_flags(args),
        model_name=args.model_name,
        registry=args.registry,
        work_dir=args.work_dir,
    )
    print(result.summary())
    return result


if __name__ == "__main__":
    main()
