"""Score Image Model: a trained ModelDirectory scores an ImageDirectory into Azure's table shape."""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import torch
from torch.utils.data import DataLoader

from tasks.errors import InvalidDatasetError
from tasks.image_directory import ImageDirectory
from tasks.model_directory import ModelDirectory
from tasks.training.data import ImageFiles, eval_transform
from tasks.training.models import load_trained_model

SCORED_LABELS = "Scored Labels"
PROBABILITY_PREFIX = "Scored Probabilities_"
IMAGE_COLUMN = "image"
LABEL_COLUMN = "label"


def probability_column(class_name: str) -> str:
    return f"{PROBABILITY_PREFIX}{class_name}"


def score_images(model_dir: ModelDirectory, images: ImageDirectory, batch_size: int = 64) -> pd.DataFrame:
    """One row per image: ``image``, ``Scored Labels``, ``Scored Probabilities_<class>``..., and ``label`` when known."""
    if images.labeled and not set(images.classes) <= set(model_dir.classes):
        unknown = sorted(set(images.classes) - set(model_dir.classes))
        raise InvalidDatasetError(f"{images.root} has classes {unknown} the model {model_dir.root} was not trained on")
    spec = model_dir.spec
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    model = load_trained_model(model_dir, device)
    dataset = ImageFiles(images.samples(), eval_transform(spec.image_size, spec.mean, spec.std))
    loader = DataLoader(dataset, batch_size=batch_size, pin_memory=device.type == "cuda")
    batches = []
    with torch.inference_mode():
        for batch, _ in loader:
            batches.append(torch.softmax(model(batch.to(device)), dim=1).float().cpu())
    probabilities = torch.cat(batches).numpy() if batches else torch.empty(0, len(model_dir.classes)).numpy()

    table = pd.DataFrame({IMAGE_COLUMN: [record.path for record in images.manifest.images]})
    table[SCORED_LABELS] = [model_dir.classes[i] for i in probabilities.argmax(axis=1)]
    for index, name in enumerate(model_dir.classes):
        table[probability_column(name)] = probabilities[:, index]
    if images.labeled:
        table[LABEL_COLUMN] = [record.label for record in images.manifest.images]
    return table


def scored_classes(scores: pd.DataFrame) -> list[str]:
    """The class names of a scores table, in model output order."""
    return [c[len(PROBABILITY_PREFIX):] for c in scores.columns if c.startswith(PROBABILITY_PREFIX)]


def read_scores(path: str | Path) -> pd.DataFrame:
    """Read a scores CSV keeping class names as text ('01' stays '01')."""
    return pd.read_csv(path, dtype={IMAGE_COLUMN: str, SCORED_LABELS: str, LABEL_COLUMN: str})


# --- Prefect task -------------------------------------------------------------------------------
from prefect import task  # noqa: E402
from prefect.artifacts import create_table_artifact  # noqa: E402
from prefect.cache_policies import NO_CACHE  # noqa: E402

PREVIEW_ROWS = 20


@task(name="score", cache_policy=NO_CACHE)
def score(model_dir: str, image_dir: str, output_csv: str) -> str:
    """Write the scores CSV; artifact ``scores``: its first rows."""
    table = score_images(ModelDirectory(model_dir), ImageDirectory(image_dir))
    Path(output_csv).parent.mkdir(parents=True, exist_ok=True)
    table.to_csv(output_csv, index=False)
    create_table_artifact(
        key="scores",
        table=table.head(PREVIEW_ROWS).round(4).to_dict(orient="records"),
        description=f"first {min(PREVIEW_ROWS, len(table))} of {len(table)} scored images; all in {output_csv}",
    )
    return output_csv
