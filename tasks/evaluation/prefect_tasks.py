"""The Prefect tasks of scoring and evaluation: ``score`` (artifact ``scores``; ``publish_scores`` is shared with
the sharded scoring's merge), ``evaluate`` (artifacts ``evaluation`` and ``confusion-matrix``),
``show_misclassified`` (artifact ``misclassified-images``), ``export_and_check_onnx`` (artifact ``onnx-export``) and
``compare`` (artifact ``model-comparison``), around the plain modules of this package, which import no Prefect.

torch comes in with the ``score`` and ``export_and_check_onnx`` runs (imported in their bodies), so importing this
module, and the flows that import it, loads no torch."""

from __future__ import annotations

import time
from pathlib import Path

from prefect.artifacts import create_markdown_artifact, create_table_artifact
from pydantic import BaseModel, Field

from tasks.contracts.image_directory import ImageDirectory
from tasks.contracts.model_directory import ONNX_FILE, ModelDirectory
from tasks.contracts.scores_table import (
    BATCH_SIZE,
    LABEL_COLUMN,
    Precision,
    Runtime,
    ScoresSummary,
    probability_column,
    read_scores,
    write_score_chunks,
)
from tasks.evaluation.comparison import comparison_rows, figures_of
from tasks.evaluation.evaluate import Evaluation, evaluate_scores, evaluation_markdown
from tasks.evaluation.gallery import GALLERY_SIZE, gallery_markdown
from tasks.evaluation.plots import plot_confusion_matrix, plot_two_class_curves, significant
from tasks.markdown import png_markdown
from tasks.retrying import stage_task

PREVIEW_ROWS = 20


class Scored(BaseModel):
    table: str = Field(description="where the scores CSV was written")
    images: int
    labeled: bool = Field(description="the table has a 'label' column: it can be evaluated")


@stage_task
def score(
    model_dir: str,
    image_dir: str,
    output_csv: str,
    runtime: Runtime = "torch",
    batch_size: int = BATCH_SIZE,
    top_k: int = 0,
    precision: Precision = "fp32",
    calibration: str | None = None,
) -> Scored:
    """Write the scores CSV (a path or s3:// URI) as the images are scored, with ``top_k`` best labels per image
    when > 0; artifact ``scores``: a summary, the runtime and precision it ran with, and the first rows."""
    from tasks.evaluation.score import score_chunks  # torch: only a run that scores loads it

    started = time.perf_counter()
    images = ImageDirectory(image_dir)
    options = dict(batch_size=batch_size, runtime=runtime, top_k=top_k, precision=precision, calibration=calibration)
    chunks = score_chunks(ModelDirectory(model_dir), images, **options)
    summary = write_score_chunks(chunks, output_csv, rows=len(images), preview_rows=PREVIEW_ROWS)
    return publish_scores(summary, time.perf_counter() - started, f"{runtime} {precision}", output_csv)


def publish_scores(summary: ScoresSummary, seconds: float, ran_with: str, output_csv: str) -> Scored:
    """Artifact ``scores``: how many images in how long (``ran_with``: the runtime and precision), the summary and
    the first rows."""
    create_table_artifact(
        key="scores",
        table=summary.head.round(4).to_dict(orient="records"),
        description=f"{summary.rows} images scored with {ran_with} in {seconds:.1f} s "
        f"({summary.rows / max(seconds, 1e-9):.0f} images/s); {summary.text()}. "
        f"First {min(PREVIEW_ROWS, summary.rows)} rows below; all in {output_csv}",
    )
    return Scored(table=output_csv, images=summary.rows, labeled=LABEL_COLUMN in summary.columns)


@stage_task
def evaluate(scores_csv: str, picture: str | None = None) -> Evaluation:
    """Artifacts ``evaluation`` (figures, per-class report, confusion matrix; for two classes ROC and
    precision-recall curves too) and ``confusion-matrix`` (a table); the matrix is also drawn to ``picture``
    (default: beside a local CSV), the curves to ``roc_pr_curves.png`` beside it."""
    scores = read_scores(scores_csv)
    evaluation = evaluate_scores(scores)
    picture_path = (Path(picture) if picture else Path(scores_csv).with_name("confusion_matrix.png")).resolve()
    picture_path.parent.mkdir(parents=True, exist_ok=True)
    plot_confusion_matrix(evaluation.confusion_matrix, evaluation.classes, picture_path)
    markdown = (
        evaluation_markdown(evaluation)
        + f"\n{png_markdown(picture_path, 'confusion matrix')}\n\nAlso saved as `{picture_path}`.\n"
    )
    if len(evaluation.classes) == 2 and evaluation.auc_ovr is not None:
        curves_path = picture_path.with_name("roc_pr_curves.png")
        positive = evaluation.classes[1]
        plot_two_class_curves(
            scores[LABEL_COLUMN].astype(str).to_numpy(),
            scores[probability_column(positive)].to_numpy(dtype=float),
            positive,
            0.5,
            curves_path,
        )
        markdown += (
            f"\n{png_markdown(curves_path, 'ROC and precision-recall curves')}\n\n'{positive}' is the "
            f"positive class; the dot marks the threshold 0.5 (the scored label). Also saved as `{curves_path}`.\n"
        )
    create_markdown_artifact(key="evaluation", markdown=markdown, description=evaluation.headline())
    create_table_artifact(
        key="confusion-matrix",
        table=[
            {"true class": name, **dict(zip(evaluation.classes, row))}
            for name, row in zip(evaluation.classes, evaluation.confusion_matrix)
        ],
        description=f"one row per true class, one column per predicted class; {evaluation.headline()}",
    )
    return evaluation


@stage_task(retries=0)
def show_misclassified(scores_csv: str, image_dir: str, count: int = GALLERY_SIZE) -> str:
    """Artifact ``misclassified-images``: the gallery of the most confidently misclassified images."""
    markdown, description = gallery_markdown(read_scores(scores_csv), ImageDirectory(image_dir), count)
    create_markdown_artifact(key="misclassified-images", markdown=markdown, description=description)
    return description


@stage_task(retries=0)
def export_and_check_onnx(model_dir: str, image_dir: str | None = None) -> str:
    """Export ``model.onnx`` and check it against PyTorch on ``image_dir``'s images; artifact ``onnx-export``."""
    from tasks.evaluation.onnx_export import CHECK_BATCH_SIZES, ONNX_TOLERANCE, OPSET, check_onnx, export_onnx  # torch

    model = export_onnx(ModelDirectory(model_dir))
    worst = check_onnx(model, ImageDirectory(image_dir) if image_dir else None)
    create_markdown_artifact(
        key="onnx-export",
        markdown=f"### ONNX export\n\n`{model.root / ONNX_FILE}`: opset {OPSET}, dynamic batch size; largest "
        f"difference from PyTorch in probability {worst:.2e} (allowed {ONNX_TOLERANCE:.0e}) at batch sizes "
        f"{', '.join(map(str, CHECK_BATCH_SIZES))}\n",
        description=f"model.onnx matches PyTorch within {worst:.2e} (allowed {ONNX_TOLERANCE:.0e})",
    )
    return model_dir


@stage_task
def compare(left: str, right: str, registry: str = "registry") -> list[dict]:
    """Two scores CSVs or two registry references side by side; artifact ``model-comparison``."""
    (left_name, left_figures), (right_name, right_figures) = figures_of(left, registry), figures_of(right, registry)
    if left_name == right_name:
        left_name, right_name = f"{left_name} (left)", f"{right_name} (right)"
    rows = comparison_rows(left_figures, right_figures, left_name, right_name)
    create_table_artifact(
        key="model-comparison",
        table=[{k: significant(v) for k, v in row.items()} for row in rows],
        description=f"{left_name} vs {right_name}; difference = right - left (4 significant digits)",
    )
    return rows
