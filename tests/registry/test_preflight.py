"""The registry's checks before any work (tasks/registry/preflight.py): names, aliases, the location, a reference
resolved, each refused in one line and without a model trained or fetched."""

import pytest

from tasks.errors import InvalidModelNameError, InvalidStorageURIError, ModelNotFoundError
from tasks.registry.preflight import check_model_reference, check_registration_inputs


def test_a_malformed_name_alias_or_s3_registry_is_refused_before_any_work(tmp_path):
    registry = str(tmp_path / "registry")
    check_registration_inputs(registry, "digits-resnet18", "production")
    check_registration_inputs(registry, None, None)
    with pytest.raises(InvalidModelNameError, match="model name 'Digits!' is not allowed"):
        check_registration_inputs(registry, "Digits!", None)
    with pytest.raises(InvalidModelNameError, match="alias 'Prod uction' is not allowed"):
        check_registration_inputs(registry, None, "Prod uction")
    with pytest.raises(InvalidStorageURIError, match="names no bucket"):
        check_registration_inputs("s3://", None, None)


def test_a_model_is_a_folder_or_a_reference_the_registry_resolves(tmp_path):
    registry = str(tmp_path / "registry")
    check_model_reference(str(tmp_path), registry)  # a folder: its stage reads it
    with pytest.raises(ModelNotFoundError, match="digits"):
        check_model_reference("digits@production", registry)
    with pytest.raises(InvalidModelNameError, match="neither a model directory nor a registry reference"):
        check_model_reference("no such/folder/here", registry)
