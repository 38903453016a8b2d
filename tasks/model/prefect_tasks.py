"""The Prefect tasks of the untrained model: ``resolve_pretrained_weights`` (artifact ``pretrained-weights``) and
``untrained_model_directory`` (artifact ``model-spec``), around ``untrained.py``, which imports no Prefect."""

from __future__ import annotations

from prefect import get_run_logger
from prefect.artifacts import create_markdown_artifact

from tasks.contracts.image_directory import ImageDirectory
from tasks.contracts.model_directory import ModelSpec, PretrainedWeights, read_model_spec
from tasks.model.untrained import write_untrained_model_directory
from tasks.model.warm_start import stage_warm_start
from tasks.retrying import stage_task


@stage_task
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


@stage_task(retries=0)
def untrained_model_directory(
    output: str,
    spec: ModelSpec,
    warm_start: str | None = None,
    registry: str = "registry",
    train_dir: str | None = None,
) -> str:
    """Artifact ``model-spec``. ``warm_start``: a version in ``registry`` to start from (tasks/model/warm_start.py),
    which must know the classes of ``train_dir``, the training ImageDirectory."""
    started_from = None
    if warm_start:
        classes = ImageDirectory(train_dir).classes if train_dir else []
        started_from = stage_warm_start(output, registry, warm_start, spec.architecture, classes)
        get_run_logger().info("warm start from %s (sha256 %s) in %s", started_from.name, started_from.sha256, registry)
    root = write_untrained_model_directory(output, spec, started_from)
    written = read_model_spec(root)
    described = {
        **written.model_dump(exclude={"weights", "started_from"}),
        "transformations": written.transformations.describe(),
    }
    options = "\n".join(f"| {k} | {v} |" for k, v in described.items())
    if written.started_from:
        weights = f"warm start from {written.started_from.name} (sha256 {written.started_from.sha256[:12]}…)"
    elif written.weights:
        weights = f"pretrained weights {written.weights.name} (sha256 {written.weights.sha256[:12]}…)"
    else:
        weights = "trained from scratch"
    create_markdown_artifact(
        key="model-spec",
        markdown=f"### Untrained model\n\n| option | value |\n|---|---|\n{options}\n\n{weights}\n",
        description=f"{spec.architecture}, {weights}",
    )
    return str(root)
