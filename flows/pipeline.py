"""The training pipeline: convert -> validate -> build model -> train [-> ONNX] -> score -> evaluate (and a
gallery of misclassified images) -> register [-> a person approves the promotion].

    from flows.pipeline import train_pipeline
    result = train_pipeline()                         # bundled digits, Azure defaults
    print(result.summary())

    python -m flows.pipeline --processes-per-node 2   # the same from a shell (what `make run` does)
    python -m flows.pipeline --promote-to production --export-onnx   # champion/challenger; model.onnx too
    python -m flows.pipeline --promote-to production --promotion-metric log_loss --min-improvement 0.01
    python -m flows.pipeline --promote-to production --approval   # a person approves the move in the UI
"""

from __future__ import annotations

import argparse

from prefect import flow
from prefect.states import Completed
from pydantic import BaseModel

from flows import run_folder
from tasks.approval import settle_promotion
from tasks.convert import ConversionLimits, convert
from tasks.datasets import resolve_sources
from tasks.evaluate import Evaluation, evaluate
from tasks.gallery import show_misclassified
from tasks.lost_runs import take_over_lost_run
from tasks.model import resolve_pretrained_weights, untrained_model_directory, with_pretrained_default
from tasks.model_directory import ModelSpec
from tasks.onnx_export import export_and_check_onnx
from tasks.preflight import check_training_inputs
from tasks.registry import Registration
from tasks.registry.prefect_tasks import register
from tasks.runs import Keep, tidy_registered_run
from tasks.score import score
from tasks.split import split
from tasks.train import train
from tasks.training.config import TrainingParams
from tasks.validate import validate_labels
from tasks.workdir import join, local_folder, store


class PipelineResult(BaseModel):
    model_name: str
    version: int
    location: str
    run_dir: str
    run_size_bytes: int | None = None  # after keep's tidying; None for an S3 run folder
    keep: Keep = "results"
    evaluation: Evaluation
    registration: Registration

    @property
    def top1(self) -> float:
        return self.registration.metrics["best_top1"]

    def headline(self) -> str:
        """One line, the flow run's state message: what `prefect deployment run --watch` and the UI show."""
        return (
            f"Registered {self.model_name} version {self.version} in {self.location}: top-1 {self.top1:.4g}, "
            f"F1 (macro) {self.evaluation.f1_macro:.4g} on {self.evaluation.images} validation images"
        )

    def summary(self) -> str:
        e, m = self.evaluation, self.registration.metrics
        auc = "n/a" if e.auc_ovr is None else f"{e.auc_ovr:.4f}"
        return "\n".join(
            [
                f"Registered {self.model_name} version {self.version} in {self.location}",
                f"  validation top-1 {self.top1:.4f} (best epoch {m['best_epoch']} of {m['epochs_trained']})",
                f"  accuracy {e.accuracy:.4f}, precision {e.precision_macro:.4f}, recall {e.recall_macro:.4f}, "
                f"F1 {e.f1_macro:.4f}, AUC {auc} (macro, {e.images} validation images)",
                f"  run files ({self._run_contents()}): {self.run_dir}",
                *([self._promotion_line()] if self.registration.promotion else []),
            ]
        )

    def _run_contents(self) -> str:
        what = "data, model, logs, scores" if self.keep == "all" else "data, metrics, logs, scores"
        return what if self.run_size_bytes is None else f"{what}; {self.run_size_bytes / 2**20:.1f} MB"

    def _promotion_line(self) -> str:
        p = self.registration.promotion
        champion = "no champion" if p.champion_version is None else f"version {p.champion_version}: {p.champion}"
        verdict = f"promoted to {p.alias!r}" if p.promoted else f"not promoted to {p.alias!r}"
        line = f"  {verdict} on {p.metric} ({p.challenger:.4f} vs {champion})"
        if p.approval:
            who = f" by {p.approval.reviewer}" if p.approval.reviewer else ""
            line += f"; {p.approval.decision}{who}" + (f": {p.approval.comment}" if p.approval.comment else "")
        return line


@flow(name="train-pipeline", log_prints=True)
def train_pipeline(
    train_data: str | None = None,
    validation_data: str | None = None,
    validation_fraction: float | None = None,
    model: ModelSpec = ModelSpec(),
    training: TrainingParams = TrainingParams(),
    conversion: ConversionLimits = ConversionLimits(),
    model_name: str | None = None,
    registry: str = "registry",
    work_dir: str = "runs",
    promote_to: str | None = None,
    promotion_metric: str = "accuracy",
    lower_is_better: bool | None = None,
    min_improvement: float = 0.0,
    export_onnx: bool = False,
    approval: bool = False,
    approval_timeout_s: int = 3600,
    keep: Keep = "results",
    replaces_run: str | None = None,
) -> PipelineResult:
    """Train an image classifier from class-per-folder images, evaluate it and register it.

    Args:
        train_data: Class-per-folder folder or .zip of training images (cat/1.jpg, dog/2.jpg, ...); empty: the bundled digits.
        validation_data: Validation images with the same classes; empty: split off train_data by validation_fraction.
        validation_fraction: Share of each class's images split off train_data for validation (e.g. 0.2), identical images on one side; with no data given, the digits' share.
        model: The torchvision architecture (Azure's DenseNet / ResNet modules, EfficientNet, ConvNeXt, ViT...) and its options; pretrained
            empty: ImageNet weights for your own images, none for the bundled digits.
        training: Training parameters; defaults are Azure's "Train PyTorch Model" component's.
        conversion: Limits on what converting the images may unpack and decode (archive size, pixels per image, memory).
        model_name: Registry name; empty: the training data's name, a dash and the architecture, e.g. digits-resnet18.
        registry: Registry folder or s3://bucket/prefix.
        work_dir: Folder or s3://bucket/prefix for each run's converted data, model, logs and scores; on S3 the
            training hosts need no shared filesystem (each keeps a cache, $IMAGE_CLASSIFIER_CACHE).
        promote_to: Alias (e.g. production) the new version takes only if it beats the alias's current version.
        promotion_metric: Figure compared for promotion (accuracy, f1_macro, auc_ovr, log_loss, ...).
        lower_is_better: Whether a lower figure is better; empty: yes for figures named ...loss (log_loss), else no.
        min_improvement: How much better than the champion the new version must be (in the figure's units) to take the alias.
        export_onnx: Also export model.onnx (checked against PyTorch with onnxruntime) and register it.
        approval: With promote_to: a new version that beats the champion takes the alias only once a person approves it (the run pauses on a form).
        approval_timeout_s: How long the run waits for that answer; no answer in time: not promoted.
        keep: What the run folder keeps once the version is registered: results (data, metrics, logs, scores, pictures; the registry holds the model, the checkpoints go) or all.
        replaces_run: Set by the automation that runs a crashed training again: the lost run's id; this run takes over its folder and resumes from its checkpoint.
    """
    # A run replacing a lost one says so first, and works in the lost training's folder (tasks/lost_runs.py).
    takeover = take_over_lost_run(replaces_run, work_dir) if replaces_run else None
    # Before any work: the data paths and their classes, the size the network takes, the names (tasks/preflight.py).
    check_training_inputs(
        train_data,
        validation_data,
        validation_fraction,
        model.architecture,
        training.image_size,
        model_name,
        registry,
        promote_to,
        model.weights_path,
    )
    spec = with_pretrained_default(model, own_data=bool(train_data or validation_data))
    resolve_pretrained_weights(spec)  # in the cache (or the one offline error) before any conversion work
    run_dir = takeover.run_dir if takeover else run_folder(work_dir)  # a retried run finds its checkpoints again
    here = local_folder(run_dir)  # this host's files: run_dir itself, or its copy in the cache when on S3
    train_source, validation_source = resolve_sources(
        train_data, validation_data, str(local_folder(work_dir)), validation_fraction
    )
    if validation_source is None:  # one set given: split it, the first side for training
        source_dir = convert(train_source, str(here / "data" / "source"), "source", limits=conversion)
        train_dir, validation_dir = split(
            source_dir,
            str(here / "data" / "train"),
            str(here / "data" / "validation"),
            fraction=1 - validation_fraction,
            seed=training.random_seed,
        )
    else:
        train_dir = convert(train_source, str(here / "data" / "train"), "train", limits=conversion)
        validation_dir = convert(validation_source, str(here / "data" / "validation"), "validation", limits=conversion)
    validate_labels(train_dir, validation_dir)
    spec_dir = untrained_model_directory(str(here / "model_spec"), spec)
    # Where every training node reads them: the same folders, or their copies stored in the S3 run folder.
    stored = [
        store(local, join(run_dir, *parts))
        for local, parts in (
            (train_dir, ("data", "train")),
            (validation_dir, ("data", "validation")),
            (spec_dir, ("model_spec",)),
        )
    ]
    model_dir = train(*stored, join(run_dir, "model"), training)
    if export_onnx:
        model_dir = export_and_check_onnx(model_dir, validation_dir)
    scores = score(model_dir, validation_dir, join(run_dir, "scores.csv")).table
    evaluation = evaluate(scores, str(here / "confusion_matrix.png"))
    show_misclassified(scores, validation_dir)
    registered = register(
        registry,
        model_name,
        model_dir,
        evaluation.figures(),
        datasets={"train": train_dir, "validation": validation_dir},
        params={"model": model.model_dump(), "training": training.model_dump()},
        promote_to=promote_to,
        promotion_metric=promotion_metric,
        lower_is_better=lower_is_better,
        min_improvement=min_improvement,
        approval=approval,
        training_run_id=takeover.training_run_id if takeover else None,
    )
    registered = settle_promotion(registry, registered, approval_timeout_s)
    record = registered.registration
    size = tidy_registered_run(
        run_dir, model_dir, keep, {"name": record.name, "version": record.version, "location": registered.location}
    )
    result = PipelineResult(
        model_name=registered.registration.name,
        version=registered.registration.version,
        location=registered.location,
        run_dir=run_dir,
        run_size_bytes=size,
        keep=keep,
        evaluation=evaluation,
        registration=registered.registration,
    )
    # Prefect keeps a returned state as the run's final one, message included, and hands the caller its data:
    # `train_pipeline(...)` still returns the PipelineResult.
    return Completed(message=result.headline(), data=result)


def main(argv: list[str] | None = None, prog: str = "python -m flows.pipeline") -> int:
    """Command line: the flow's parameters as flags, one per ModelSpec, TrainingParams and ConversionLimits field.

    A user's mistake is one line on stderr and exit status 2, found before any work where it can be (see
    tasks/preflight.py); the run's full log goes to <work-dir>/logs/pipeline-<time>-<pid>.log."""
    import json

    from flows import cli

    parser = cli.CommandParser(prog=prog, description=train_pipeline.description)
    parser.add_argument("--train-data", help="class-per-folder folder or .zip (default: bundled digits)")
    parser.add_argument("--validation-data", help="validation images with the same classes")
    parser.add_argument(
        "--validation-fraction", type=float, help="without --validation-data: share of --train-data split off for it"
    )
    parser.add_argument("--model-name", help="registry name (default: <data set>-<architecture>)")
    parser.add_argument("--registry", default="registry", help="folder or s3://bucket/prefix (default: registry)")
    parser.add_argument("--work-dir", default="runs", help="folder or s3://bucket/prefix for the runs (default: runs)")
    parser.add_argument("--promote-to", help="alias the new version takes if it beats the alias's current version")
    parser.add_argument("--promotion-metric", default="accuracy", help="figure compared (default: accuracy)")
    parser.add_argument(
        "--lower-is-better",
        action=argparse.BooleanOptionalAction,
        help="a lower figure is better (default: for figures named ...loss)",
    )
    parser.add_argument("--min-improvement", type=float, default=0.0, help="margin a challenger must win by")
    parser.add_argument("--export-onnx", action="store_true", help="also export and register model.onnx")
    parser.add_argument(
        "--approval", action="store_true", help="with --promote-to: a person approves the move in the UI"
    )
    parser.add_argument("--approval-timeout-s", type=int, default=3600, help="no answer in time: not promoted")
    parser.add_argument(
        "--keep",
        choices=["results", "all"],
        default="results",
        help="what the run folder keeps once registered: results (the registry holds the model; default) or all",
    )
    model_flags = cli.add_model_flags(parser, ModelSpec, skip=("weights", "transformations"), group="model (ModelSpec)")
    parser.add_argument(
        "--transformations", type=json.loads, help="image transformations as JSON (see docs/training.md)"
    )
    training_flags = cli.add_model_flags(parser, TrainingParams, group="training (TrainingParams)")
    conversion_flags = cli.add_model_flags(parser, ConversionLimits, group="conversion limits (ConversionLimits)")
    cli.add_debug_flag(parser)
    args = parser.parse_args(argv)
    try:
        extra = {} if args.transformations is None else {"transformations": args.transformations}
        spec = cli.model_from_flags(ModelSpec, args, model_flags, **extra)
        training = cli.model_from_flags(TrainingParams, args, training_flags)
        conversion = cli.model_from_flags(ConversionLimits, args, conversion_flags)
        check_training_inputs(
            args.train_data,
            args.validation_data,
            args.validation_fraction,
            spec.architecture,
            training.image_size,
            args.model_name,
            args.registry,
            args.promote_to,
            spec.weights_path,
        )
    except cli.INPUT_ERRORS as error:
        cli.fail(error, args.debug)
    result = cli.run_command(
        lambda: train_pipeline(
            train_data=args.train_data,
            validation_data=args.validation_data,
            validation_fraction=args.validation_fraction,
            model=spec,
            training=training,
            conversion=conversion,
            model_name=args.model_name,
            registry=args.registry,
            work_dir=args.work_dir,
            promote_to=args.promote_to,
            promotion_metric=args.promotion_metric,
            lower_is_better=args.lower_is_better,
            min_improvement=args.min_improvement,
            export_onnx=args.export_onnx,
            approval=args.approval,
            approval_timeout_s=args.approval_timeout_s,
            keep=args.keep,
        ),
        log_file=cli.log_file_for(args.work_dir, "pipeline"),
        debug=args.debug,
    )
    print(result.summary())
    return 0  # an exit status: console scripts call sys.exit(main())


if __name__ == "__main__":
    raise SystemExit(main())
