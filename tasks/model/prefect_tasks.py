"""The Prefect tasks of the untrained model: ``resolve_pretrained_weights`` (artifact ``pretrained-weights``) and
``untrained_model_directory`` (artifact ``model-spec``), around ``untrained.py``, which imports no Prefect."""

from __future__ import annotations

from prefect import get_run_logger
from prefect.artifacts import create_markdown_artifact

from tasks.contracts.model_directory import ModelSpec, PretrainedWeights, read_model_spec
from tasks.model.untrained import write_untrained_model_directory
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
