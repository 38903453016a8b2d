"""DenseNet / ResNet: write an UntrainedModelDirectory for the training stage (Azure's model modules), with its
pretrained weights checked and staged beside the spec."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

from tasks.contracts.model_directory import (
    STAGED_WEIGHTS_FILE,
    ModelSpec,
    PretrainedWeights,
    read_model_spec,
    write_model_spec,
)
from tasks.storage.local_files import atomic_write


def with_pretrained_default(spec: ModelSpec, own_data: bool) -> ModelSpec:
    """``pretrained`` left empty means ImageNet weights for the user's own images (or a weights_path given) and
    none for the bundled digits, so that a first run on them needs no network."""
    if spec.pretrained is not None:
        return spec
    return spec.model_copy(update={"pretrained": own_data or spec.weights_path is not None})


def write_untrained_model_directory(output: str | os.PathLike[str], spec: ModelSpec) -> Path:
    """Write ``spec`` to ``output/model_spec.json``. With pretrained weights: resolve them (``tasks.vision.weights``:
    cache, mirror or URL, hash checked), check that they fit the architecture, copy the file into the directory
    (``pretrained_weights.pth``) and record its origin in the spec's ``weights``.

    Checking here, not in the worker, fails a bad weights file before any training job is launched; staging here,
    the file travels with the run, so training nodes never download.
    """
    output = Path(output)
    if not spec.pretrained:
        (output / STAGED_WEIGHTS_FILE).unlink(missing_ok=True)
        return write_model_spec(output, spec.model_copy(update={"weights": None}))
    from tasks.vision.networks import build_network
    from tasks.vision.weights import resolve_weights

    resolved = resolve_weights(spec)
    build_network(spec, num_classes=2, weights_file=resolved.path)
    output.mkdir(parents=True, exist_ok=True)
    with open(resolved.path, "rb") as source, atomic_write(output / STAGED_WEIGHTS_FILE, "wb") as staged:
        shutil.copyfileobj(source, staged)
    return write_model_spec(output, spec.model_copy(update={"weights": resolved.origin}))


# --- Prefect tasks ------------------------------------------------------------------------------
from prefect import get_run_logger, task  # noqa: E402
from prefect.artifacts import create_markdown_artifact  # noqa: E402
from prefect.cache_policies import NO_CACHE  # noqa: E402

from tasks.retrying import stage_task  # noqa: E402


@stage_task("resolve-weights")
def resolve_pretrained_weights(spec: ModelSpec) -> PretrainedWeights | None:
    """Fetch the pretrained weights into this host's cache (or fail with the one offline error) before any other
    work of the run. Artifact ``pretrained-weights``: where they came from."""
    if not spec.pretrained:
        get_run_logger().info("%s trained from scratch: no pretrained weights", spec.architecture)
        return None
    from tasks.vision.weights import resolve_weights

    origin = resolve_weights(spec).origin
    get_run_logger().info("pretrained weights %s (sha256 %s) from %s", origin.name, origin.sha256, origin.source)
    create_markdown_artifact(
        key="pretrained-weights",
        markdown=f"### Pretrained weights\n\n| file | sha256 | from |\n|---|---|---|\n"
        f"| {origin.name} | `{origin.sha256}` | {origin.source} |\n",
        description=f"{origin.name} from {origin.source}",
    )
    return origin


@task(name="untrained-model", cache_policy=NO_CACHE)
def untrained_model_directory(output: str, spec: ModelSpec) -> str:
    """Artifact ``model-spec``."""
    root = write_untrained_model_directory(output, spec)
    written = read_model_spec(root)
    described = {
        **written.model_dump(exclude={"weights"}),
        "transformations": written.transformations.describe(),
    }
    options = "\n".join(f"| {k} | {v} |" for k, v in described.items())
    weights = (
        f"pretrained weights {written.weights.name} (sha256 {written.weights.sha256[:12]}…)"
        if written.weights
        else "trained from scratch"
    )
    create_markdown_artifact(
        key="model-spec",
        markdown=f"### Untrained model\n\n| option | value |\n|---|---|\n{options}\n\n{weights}\n",
        description=f"{spec.architecture}, {weights}",
    )
    return str(root)
