"""Score Image Model and compare models: convert -> resolve model -> score -> evaluate (when labeled).

from flows.score import score_pipeline, compare_models
result = score_pipeline("photos.zip", "digits-resnet18@production", output_csv="scores.csv")
compare_models("digits-resnet18/1", "digits-resnet18/2")          # or two scores CSVs

python -m flows.score data/digits/validation digits-resnet18@production --output scores.csv
"""

from __future__ import annotations

from prefect import flow
from prefect.states import Completed
from pydantic import BaseModel

from flows import run_folder
from flows.cli import checks
from tasks.contracts.conversion_limits import ConversionLimits
from tasks.contracts.scores_table import BATCH_SIZE, Precision, Runtime
from tasks.convert.prefect_tasks import convert
from tasks.data.preflight import check_source
from tasks.errors import PipelineInputError
from tasks.evaluation.evaluate import Evaluation
from tasks.evaluation.prefect_tasks import compare, evaluate, score
from tasks.registry.prefect_tasks import resolve_model
from tasks.registry.preflight import check_model_reference
from tasks.score_shards.parts import DEFAULT_TIMEOUT_S, ShardPool, check_sharding
from tasks.storage.work_dir_on_s3 import join, local_folder


class ScoreResult(BaseModel):
    model_dir: str
    scores: str
    images: int
    evaluation: Evaluation | None = None

    def headline(self) -> str:
        """One line, the flow run's state message (the UI and `prefect deployment run --watch` show it)."""
        scored = f"Scored {self.images} images with {self.model_dir} into {self.scores}"
        return f"{scored}; {self.evaluation.headline()}" if self.evaluation else scored


@flow(name="score-pipeline", log_prints=True)
def score_pipeline(
    images: str,
    model: str,
    output_csv: str | None = None,
    registry: str = "registry",
    runtime: Runtime = "torch",
    batch_size: int = BATCH_SIZE,
    work_dir: str = "runs",
    labeled: bool | None = None,
    conversion: ConversionLimits = ConversionLimits(),
    top_k: int = 0,
    shards: int = 1,
    shard_pool: ShardPool = "gpu",
    max_failed_images: int = 0,
    shard_timeout_s: float = DEFAULT_TIMEOUT_S,
    precision: Precision = "fp32",
    calibration: str | None = None,
) -> ScoreResult:
    """Score images with a trained model into a table of Azure's columns; evaluate it when the images are labeled.

    Args:
        images: Folder, archive or S3 prefix of images; class folders make them labeled (and evaluated).
        model: Registry reference ('name', 'name/3', 'name@production') or a ModelDirectory path.
        output_csv: Where the scores table goes (path or s3://bucket/key.csv); empty: scores.csv in the run folder.
        registry: Registry folder or s3://bucket/prefix that references resolve in.
        runtime: 'torch', or 'onnx' for a model registered with its model.onnx (train with export_onnx).
        batch_size: Images per forward pass.
        work_dir: Folder or s3://bucket/prefix for each run's scores (converted images and models fetched from S3
            go to this host's cache when it is on S3).
        labeled: Empty: inferred (two or more class folders, or a labels file, are evaluated; a single
            folder of images is scored unlabeled); true: labels required, even a single class folder;
            false: scored without labels whatever the folders.
        conversion: Limits on what converting the images may unpack and decode (archive size, pixels per image, memory).
        top_k: Also list each image's k most probable labels and their probabilities (columns Top 1 Label, Top 1 Probability, ...); 0: none.
        shards: 1: scored here, in this flow's process. More: the images' index cut into this many ranges, each scored by a run of the score-shard deployment on the shard_pool, the parts merged into one table (docs/scoring.md).
        shard_pool: The work pool the shards run on: gpu, or default (CPU hosts).
        max_failed_images: With shards: how many images may fail to read or decode and stay as rows with an 'error' column and no scores; one more fails the run, naming them.
        shard_timeout_s: With shards: a shard running longer than this is cancelled and run again (at most twice).
        precision: fp32; bf16 (autocast, on a GPU); int8 (ONNX Runtime on the CPU, quantized once and kept beside the model; one warning and fp32 on a CPU where it does not pay). Scoring in shards is fp32.
        calibration: With int8, the first time for this model: its validation ImageDirectory, which quantization is calibrated on.
    """
    check_arguments(
        images=images,
        model=model,
        registry=registry,
        shards=shards,
        max_failed_images=max_failed_images,
        shard_timeout_s=shard_timeout_s,
        precision=precision,
    )
    run_dir = run_folder(work_dir, prefix="score-")
    here = local_folder(run_dir)  # this host's files: run_dir itself, or its copy in the cache when on S3
    model_dir = resolve_model(model, registry, str(local_folder(work_dir).resolve() / "models"))  # before converting
    image_dir = convert(
        images, str(here / "images"), "score", labeled=labeled, single_class="unlabeled", limits=conversion
    )
    output = output_csv or join(run_dir, "scores.csv")
    if shards > 1:
        from tasks.score_shards.prefect_tasks import score_in_shards

        scored = score_in_shards(
            model_dir,
            image_dir,
            run_dir,
            output,
            shards=shards,
            pool=shard_pool,
            runtime=runtime,
            batch_size=batch_size,
            top_k=top_k,
            max_failed_images=max_failed_images,
            timeout_s=shard_timeout_s,
        )
    else:
        scored = score(model_dir, image_dir, output, runtime, batch_size, top_k, precision, calibration)
    evaluation = evaluate(scored.table, str(here / "confusion_matrix.png")) if scored.labeled else None
    result = ScoreResult(model_dir=model_dir, scores=scored.table, images=scored.images, evaluation=evaluation)
    return Completed(message=result.headline(), data=result)  # callers get the ScoreResult, the UI the message


@flow(name="compare-models", log_prints=True)
def compare_models(left: str, right: str, registry: str = "registry") -> list[dict]:
    """Two scored tables, or two registered versions, side by side (artifact ``model-comparison``).

    Args:
        left: A scores CSV or a registry reference.
        right: A scores CSV or a registry reference.
        registry: Registry folder or s3://bucket/prefix that references resolve in.
    """
    return compare(left, right, registry)


@checks(score_pipeline)
def check_arguments(
    *,
    images: str,
    model: str,
    registry: str,
    shards: int,
    max_failed_images: int,
    shard_timeout_s: float,
    precision: Precision,
) -> None:
    """The command line's checks, before a server is started: the sharding, the images, the model."""
    check_sharding(shards, max_failed_images, shard_timeout_s)
    if shards > 1 and precision != "fp32":
        raise PipelineInputError(f"precision {precision!r} scores in one process: give shards 1, or precision fp32")
    check_scoring_inputs(images, model, registry)


def check_scoring_inputs(images: str, model: str, registry: str) -> None:
    """In seconds: the images exist (tasks/data/preflight.py); the model is a model folder or a reference the
    registry resolves (tasks/registry/preflight.py)."""
    check_source(images, "scoring")
    check_model_reference(model, registry)


def main(argv: list[str] | None = None, prog: str = "python -m flows.score") -> int:
    """Command line. A user's mistake (no such images, no such model: the models that exist are listed) is one line
    on stderr and exit status 2, in seconds; the run's full log goes to <work-dir>/logs/score-<time>-<pid>.log."""
    from flows import cli

    result = cli.run_flow(
        score_pipeline,
        argv,
        prog=prog,
        check=check_arguments,
        log_name="score",
        flags={"output_csv": "--output"},
    )
    print(f"{result.images} images scored -> {result.scores}")
    if result.evaluation:
        print(f"accuracy {result.evaluation.accuracy:.4f}, F1 (macro) {result.evaluation.f1_macro:.4f}")
    return 0  # an exit status: console scripts call sys.exit(main())


if __name__ == "__main__":
    raise SystemExit(main())
