"""tasks/monitoring/reference.py: a version's reference from the real model over its validation images, registered
with it and read back checked; a version registered before gets its own on first use, from the validation images
named, or one line asking for them."""

import shutil

import numpy as np
import pytest

from tasks.contracts.image_directory import ImageDirectory
from tasks.errors import CorruptRegistryRecordError, PipelineInputError
from tasks.inference.loaded import LoadedModel
from tasks.monitoring.records import EMBEDDING_SIZE
from tasks.monitoring.reference import REFERENCE_ARRAYS, REFERENCE_FILE, compute_reference, version_reference
from tests.helpers import NAME, register_test_model


def test_the_reference_is_what_the_model_saw_and_is_registered_with_the_version(watched, colour_image_dirs, tmp_path):
    reference, registration = version_reference(str(watched), NAME)
    validation = ImageDirectory(colour_image_dirs[1])
    assert {REFERENCE_FILE, REFERENCE_ARRAYS} <= set(registration.files)
    assert reference.classes == validation.classes and sum(reference.predicted.values()) == len(validation) == 12
    assert reference.embeddings.shape == (12, EMBEDDING_SIZE) and np.all(
        (0 < reference.confidences) & (reference.confidences <= 1)
    )
    assert reference.modes == {"RGB": 12} and reference.orientations == {"1": 12}
    assert set(reference.widths.tolist()) == {16} and reference.source["content_hash"] == validation.content_hash

    copy = tmp_path / "registry"
    shutil.copytree(watched, copy)
    (copy / NAME / "1" / REFERENCE_ARRAYS).write_bytes(b"not the registered arrays")
    with pytest.raises(CorruptRegistryRecordError, match="reference.npz differ from what was registered"):
        version_reference(str(copy), NAME)


def test_a_version_registered_before_gets_its_reference_on_first_use(trained_model, colour_image_dirs, tmp_path):
    registry = str(tmp_path / "registry")
    register_test_model(registry, trained_model)
    with pytest.raises(PipelineInputError, match=r"registered before references were kept: give its validation"):
        version_reference(registry, NAME)

    computed, registration = version_reference(registry, NAME, validation=str(colour_image_dirs[1]))
    assert REFERENCE_FILE not in registration.files  # beside the version, not among its registered files
    kept, _ = version_reference(registry, f"{NAME}/1")  # no validation needed any more
    assert kept.predicted == computed.predicted and np.array_equal(kept.embeddings, computed.embeddings)
    again = compute_reference(LoadedModel.load(trained_model), ImageDirectory(colour_image_dirs[1]))
    assert np.allclose(again.confidences, computed.confidences, atol=1e-5)  # seeded: the same images each time
