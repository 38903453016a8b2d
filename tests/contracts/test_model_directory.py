import json

from tasks.contracts.model_directory import SPEC_FILE, ModelDirectory, ModelSpec, TrainedModelSpec, read_model_spec
from tasks.contracts.transformations import ImageTransformations


def test_the_spec_carries_them_through_json_and_old_specs_load_with_the_default(tmp_path):
    spec = ModelSpec(
        transformations={"random_horizontal_flip": True, "color_jitter": {"hue": 0.1}, "pad": {"padding": 2}}
    )
    assert ModelSpec.model_validate_json(spec.model_dump_json()) == spec
    assert spec.transformations.random_horizontal_flip.p == 0.5 and spec.transformations.color_jitter.brightness == 0.4
    old = {"architecture": "resnet18", "pretrained": False, "memory_efficient": False, "zero_init_residual": False}
    (tmp_path / SPEC_FILE).write_text(json.dumps(old))
    assert read_model_spec(tmp_path).transformations == ImageTransformations()
    (tmp_path / SPEC_FILE).write_text(json.dumps({**old, "num_classes": 2, "image_size": 32}))
    (tmp_path / "model.pt").write_bytes(b"")
    (tmp_path / "classes.json").write_text('["a", "b"]')
    assert ModelDirectory(tmp_path).spec.transformations == ImageTransformations()
    assert TrainedModelSpec(**spec.model_dump(), num_classes=2, image_size=32).transformations == spec.transformations
