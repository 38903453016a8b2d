"""What the registry can check before any work starts, in seconds (tasks/data/preflight.py checks the data): the
names a run registers under and promotes to, the registry's location, and a model reference resolved (its record
read, nothing downloaded). The flows call these first, and the command lines before a flow run starts."""

from __future__ import annotations

from tasks.contracts.registry_layout import check_alias, check_model_name, reference_or_folder
from tasks.registry.core import resolve
from tasks.registry.locations import open_backend
from tasks.storage.s3 import is_s3_uri


def check_registration_inputs(registry: str, model_name: str | None, promote_to: str | None) -> None:
    """The name a training registers under, the alias it promotes to, and a malformed s3:// registry."""
    if model_name is not None:
        check_model_name(model_name)
    if promote_to is not None:
        check_alias(promote_to)
    if is_s3_uri(registry):
        open_backend(registry)


def check_model_reference(model: str, registry: str) -> None:
    """``model`` is a model folder, or a reference the registry resolves (nothing fetched)."""
    reference = reference_or_folder(model)
    if reference is not None:
        resolve(registry, reference)
