"""The training pipeline: convert -> validate -> build model -> train [-> ONNX] -> score -> evaluate (and a
gallery of misclassified images) -> register [-> a person approves the promotion].

    from flows.pipeline import train_pipeline
    result = train_pipeline()                         # bundled digits, Azure defaults
    print(result.summary())

    python -m flows.pipeline --processes-per-node 2   # the same from a shell (what `make run` does)
    python -m flows.pipeline --promote-to production --export-onnx   # champion/challenger; model.onnx too
    python -m flows.pipeline --promote-to production --promotion-metric log_loss --min-improvement 0.01
    python -m flows.pipeline --promote-to production --approval   # a person approves the move in the UI
    python -m flows.pipeline --labelled-data to-label   # a sorted labelling queue joins the training images
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from prefect import flow
from prefect.states import Completed
from pydantic import BaseModel

from flows import run_folder
from flows.cli import checks
from tasks.contracts.conversion_limits import ConversionLimits
from tasks.contracts.model_directory import ModelSpec
from tasks.contracts.training_config import TrainingFolders, TrainingParams
from tasks.convert.prefect_tasks import convert
from tasks.data.prefect_tasks import resolve_sources, split, validate_labels
from tasks.data.preflight import check_training_inputs, folder_classes
from tasks.evaluation.evaluate import Evaluation
from tasks.evaluation.prefect_tasks import evaluate, export_and_check_onnx, score, show_misclassified
from tasks.launch.prefect_tasks import take_over_lost_run, train
from tasks.model.prefect_tasks import resolve_pretrained_weights, untrained_model_directory
from tasks.model.untrained import with_pretrained_default
from tasks.model.warm_start import check_warm_start
from tasks.monitoring.labelled import check_labelled_folder
from tasks.monitoring.prefect_tasks import add_labelled_images, keep_reference
from tasks.near_duplicates import DEFAULT_DISTANCE, check_distance
from tasks.registry import PromotionPolicy, Registration
from tasks.registry.prefect_tasks import register, settle_promotion
from tasks.registry.preflight import check_registration_inputs
from tasks.storage.prefect_tasks import keep_results
from tasks.storage.runs import Keep
from tasks.storage.work_dir_on_s3 import join, local_folder
from tasks.work_dir.prefect_tasks import store


class PipelineResult(BaseModel):
    model_name: str
    version: int
    location: str
    run_dir: str
    run_size_bytes: int | None = None  # after keep's tidying; None for an S3 run folder
    keep: Keep = "results"
    evaluation: Evaluation
    registration: Registration

    @classmethod
    def of(cls, registered: Any, evaluation: Evaluation, run_dir: str, size: int | None, keep: Keep) -> PipelineResult:
        """The result of a run that registered ``registered`` (what ``evaluate_and_register`` returns)."""
        return cls(
            model_name=registered.registration.name,
            version=registered.registration.version,
            location=registered.location,
            run_dir=run_dir,
            run_size_bytes=size,
            keep=keep,
            evaluation=evaluation,
            registration=registered.registration,
        )

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
    near_duplicate_distance: int = DEFAULT_DISTANCE,
    labelled_data: str | None = None,
    warm_start: str | None = None,
    model: ModelSpec = ModelSpec(),
    training: TrainingParams = TrainingParams(),
    conversion: ConversionLimits = ConversionLimits(),
    model_name: str | None = None,
    registry: str = "registry",
    work_dir: str = "runs",
    promotion: PromotionPolicy = PromotionPolicy(),
    export_onnx: bool = False,
    keep: Keep = "results",
    replaces_run: str | None = None,
) -> PipelineResult:
    """Train an image classifier from class-per-folder images, evaluate it and register it.

    Args:
        train_data: Class-per-folder folder or .zip of training images (cat/1.jpg, dog/2.jpg, ...); empty: the bundled digits.
        validation_data: Validation images with the same classes; empty: split off train_data by validation_fraction.
        validation_fraction: Share of each class's images split off train_data for validation (e.g. 0.2), identical images on one side; with no data given, the digits' share.
        near_duplicate_distance: Images whose 64-bit perceptual hashes differ in at most this many bits (a resized or re-compressed copy, the shots of a burst) stay on one side of the split, and are reported when in both train_data and validation_data; -1: identical files only.
        labelled_data: A labelling queue a person sorted (label-queue --out: each image moved into its right class folder), added to the training images only: an image already in train or validation (same sha256) is skipped and counted, one under two classes refused.
        warm_start: Start from a registered version's weights, its head included (name/3 or name@production, in the registry below), instead of ImageNet's or random ones: a served model retrained on a labelled batch keeps what it knew. The version must have this run's architecture and classes.
        model: The torchvision architecture (Azure's DenseNet / ResNet modules, EfficientNet, ConvNeXt, ViT...) and its options; pretrained
            empty: ImageNet weights for your own images, none for the bundled digits.
        training: Training parameters; defaults are Azure's "Train PyTorch Model" component's.
        conversion: Limits on what converting the images may unpack and decode (archive size, pixels per image, memory).
        model_name: Registry name; empty: the training data's name, a dash and the architecture, e.g. digits-resnet18.
        registry: Registry folder or s3://bucket/prefix.
        work_dir: Folder or s3://bucket/prefix for each run's converted data, model, logs and scores; on S3 the
            training hosts need no shared filesystem (each keeps a cache, $IMAGE_CLASSIFIER_CACHE).
        promotion: Whether the new version takes an alias (promote_to, e.g. production): only if it beats the alias's current version on a figure, and with approval only once a person approves it (the run pauses on a form).
        export_onnx: Also export model.onnx (checked against PyTorch with onnxruntime) and register it.
        keep: What the run folder keeps once the version is registered: results (data, metrics, logs, scores, pictures; the registry holds the model, the checkpoints and the staged pretrained weights go) or all.
        replaces_run: Set by the automation that runs a crashed training again: the lost run's id; this run takes over its folder and resumes from its checkpoint.
    """
    check_inputs(  # before any work
        train_data=train_data,
        validation_data=validation_data,
        validation_fraction=validation_fraction,
        near_duplicate_distance=near_duplicate_distance,
        labelled_data=labelled_data,
        warm_start=warm_start,
        model=model,
        training=training,
        model_name=model_name,
        registry=registry,
        promotion=promotion,
    )
    # A run replacing a lost one says so first, and works in the lost training's folder (tasks/launch/lost_runs.py).
    takeover = take_over_lost_run(replaces_run, work_dir) if replaces_run else None
    spec = with_pretrained_default(model, own_data=bool(train_data or validation_data), warm_start=bool(warm_start))
    resolve_pretrained_weights(spec)  # in the cache (or the one offline error) before any conversion work
    run_dir = takeover.run_dir if takeover else run_folder(work_dir)  # a retried run finds its checkpoints again
    local_run = local_folder(run_dir)  # this host's files: run_dir itself, or its copy in the cache when on S3
    train_dir, validation_dir = prepare_data(
        train_data,
        validation_data,
        validation_fraction,
        near_duplicate_distance,
        conversion,
        work_dir,
        local_run,
        training.random_seed,
        labelled_data=labelled_data,
        model_name=model_name,
        architecture=spec.architecture,
    )
    spec_dir = untrained_model_directory(str(local_run / "model_spec"), spec, warm_start, registry, train_dir)
    # Where every training node reads them: the same folders, or their copies stored in the S3 run folder.
    folders = TrainingFolders(
        train_dir=store(train_dir, join(run_dir, "data", "train")),
        validation_dir=store(validation_dir, join(run_dir, "data", "validation")),
        model_spec_dir=store(spec_dir, join(run_dir, "model_spec")),
        output_dir=join(run_dir, "model"),
    )
    model_dir = train(folders, training)
    registered, evaluation, size = evaluate_and_register(
        model_dir,
        train_dir,
        validation_dir,
        run_dir,
        registry=registry,
        model_name=model_name,
        params={"model": model.model_dump(), "training": training.model_dump()},
        promotion=promotion,
        keep=keep,
        export_onnx=export_onnx,
        training_run_id=takeover.training_run_id if takeover else None,
    )
    result = PipelineResult.of(registered, evaluation, run_dir, size, keep)
    # Prefect keeps a returned state as the run's final one, message included, and hands the caller its data:
    # `train_pipeline(...)` still returns the PipelineResult.
    return Completed(message=result.headline(), data=result)


def prepare_data(
    train_data: str | None,
    validation_data: str | None,
    validation_fraction: float | None,
    near_duplicate_distance: int,
    conversion: ConversionLimits,
    work_dir: str,
    local_run: Path,
    seed: int,
    *,
    labelled_data: str | None = None,
    model_name: str | None = None,
    architecture: str = "",
) -> tuple[str, str]:
    """Convert the images (and split one set, near-duplicates on one side) into ``local_run``/data, add a labelled
    batch's new images to the training side, and validate the labels: the training and validation
    ImageDirectories, once per run (a sweep's trials all read them)."""
    train_source, validation_source = resolve_sources(
        train_data, validation_data, str(local_folder(work_dir)), validation_fraction
    )
    if validation_source is None:  # one set given: split it, the first side for training
        source_dir = convert(train_source, str(local_run / "data" / "source"), "source", limits=conversion)
        train_dir, validation_dir = split(
            source_dir,
            str(local_run / "data" / "train"),
            str(local_run / "data" / "validation"),
            fraction=1 - validation_fraction,
            seed=seed,
            near_duplicate_distance=near_duplicate_distance,
        )
    else:
        train_dir = convert(train_source, str(local_run / "data" / "train"), "train", limits=conversion)
        validation_dir = convert(
            validation_source, str(local_run / "data" / "validation"), "validation", limits=conversion
        )
    if labelled_data:
        labelled_dir = convert(labelled_data, str(local_run / "data" / "labelled"), "labelled", limits=conversion)
        train_dir = add_labelled_images(
            train_dir,
            validation_dir,
            labelled_dir,
            str(local_run / "data" / "train-labelled"),
            labelled_data,
            model_name,
            architecture,
        )
    validate_labels(train_dir, validation_dir, near_duplicate_distance=near_duplicate_distance)
    return train_dir, validation_dir


def evaluate_and_register(
    model_dir: str,
    train_dir: str,
    validation_dir: str,
    run_dir: str,
    *,
    registry: str,
    model_name: str | None,
    params: dict[str, Any],
    promotion: PromotionPolicy,
    keep: Keep,
    export_onnx: bool = False,
    training_run_id: str | None = None,
    unregistered: Sequence[str] = (),
) -> tuple[Any, Evaluation, int]:
    """Score the trained model on the validation images, evaluate it (and show the misclassified), register it
    under the promotion policy, and tidy the run folder (``unregistered``: a sweep's other trials' model folders):
    (the registration, the evaluation, the folder's size)."""
    local_run = local_folder(run_dir)
    if export_onnx:
        model_dir = export_and_check_onnx(model_dir, validation_dir)
    scores = score(model_dir, validation_dir, join(run_dir, "scores.csv")).table
    evaluation = evaluate(scores, str(local_run / "confusion_matrix.png"))
    show_misclassified(scores, validation_dir)
    keep_reference(model_dir, validation_dir)  # registered with the version: what drift is measured against
    registered = register(
        registry,
        model_name,
        model_dir,
        evaluation.figures(),
        datasets={"train": train_dir, "validation": validation_dir},
        params=params,
        promotion=promotion,
        training_run_id=training_run_id,
    )
    registered = settle_promotion(registry, registered, promotion.approval_timeout_s)
    record = registered.registration
    where = {"name": record.name, "version": record.version, "location": registered.location}
    size = keep_results(run_dir, model_dir, keep, where, unregistered)
    return registered, evaluation, size


@checks(train_pipeline)
def check_inputs(
    *,
    train_data: str | None,
    validation_data: str | None,
    validation_fraction: float | None,
    near_duplicate_distance: int,
    model: ModelSpec,
    training: TrainingParams,
    model_name: str | None,
    registry: str,
    promotion: PromotionPolicy,
    labelled_data: str | None = None,
    warm_start: str | None = None,
) -> None:
    """What can be checked before any work (tasks/data/preflight.py, tasks/monitoring/labelled.py,
    tasks/registry/preflight.py): the data paths and their classes, a labelled batch's, the size the network takes,
    the names (the flow's and the command line's alike)."""
    check_distance(near_duplicate_distance)
    check_training_inputs(
        train_data,
        validation_data,
        validation_fraction,
        model.architecture,
        training.image_size,
        model.weights_path,
    )
    if labelled_data:
        check_labelled_folder(labelled_data, folder_classes(train_data) if train_data else None)
    check_registration_inputs(registry, model_name, promotion.promote_to)
    if warm_start:
        check_warm_start(warm_start, registry, model.pretrained)


def main(argv: list[str] | None = None, prog: str = "python -m flows.pipeline") -> int:
    """Command line: a flag per parameter of the flow, and per field of ModelSpec, TrainingParams and
    ConversionLimits (flows/flags.py FlowFlags).

    A user's mistake is one line on stderr and exit status 2, found before any work where it can be (see
    tasks/data/preflight.py and tasks/registry/preflight.py); the run's full log goes to <work-dir>/logs/pipeline-<time>-<pid>.log."""
    from flows import cli

    result = cli.run_flow(
        train_pipeline,
        argv,
        prog=prog,
        check=check_inputs,
        log_name="pipeline",
        # replaces_run is the lost-host automation's; a model's weights record is the model stage's.
        skip=("replaces_run",),
        skip_fields={"model": ("weights", "started_from")},
    )
    print(result.summary())
    return 0  # an exit status: console scripts call sys.exit(main())


if __name__ == "__main__":
    raise SystemExit(main())
