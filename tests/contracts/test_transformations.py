import pytest
from pydantic import ValidationError

from tasks.contracts.model_directory import ModelSpec
from tasks.contracts.transformations import ImageTransformations, RandomRotation, Resize
from tests.contracts.transformation_options import EVERY_OPTION


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"random_flip": True}, "unknown transformations ['random_flip']: the options are resize, center_crop"),
        ({"random_horizontal_flip": {"p": 1.5}}, "less than or equal to 1"),
        ({"random_resized_crop": {"scale": (0.9, 0.2)}}, "scale (0.9, 0.2) is not allowed: give (min, max) with"),
        ({"color_jitter": {"brightness": 0, "contrast": 0, "saturation": 0}}, "color_jitter changes nothing"),
        ({"resize": {"keep_aspect_ratio": True}}, "keep resize (to size x size) or add center_crop"),
        ({"resize": None}, "images of different shapes cannot be batched"),
        ({"random_crop": {"padding_mode": "wrap"}}, "'constant', 'edge', 'reflect' or 'symmetric'"),
        ({"pad": {"padding": 2, "fill": 300}}, "less than or equal to 255"),
    ],
)
def test_bad_options_say_what_is_allowed(options, message):
    with pytest.raises(ValidationError, match="transformations") as error:
        ModelSpec(transformations=options)
    assert message in str(error.value)


def test_describe_names_the_options_in_order():
    assert ImageTransformations().describe(32) == "resize to 32x32, random crop 32x32, padding 4 px (edge)"
    assert ImageTransformations().describe() == (
        "resize to the training size, random crop the training size, padding 0.125 of the size (edge)"
    )
    assert ImageTransformations().for_inference().describe(224) == "resize to 224x224"
    assert EVERY_OPTION.describe(16).endswith("perspective, color jitter, random grayscale, random erasing")


def test_a_deployment_run_takes_true_for_an_option_as_python_and_the_command_line_do():
    """The server checks a deployment run's parameters against the schema `prefect deploy` stores (the UI's form is
    built from it too): true is an option with its defaults there as well, a wrong type is still refused."""
    from prefect.utilities.callables import parameter_schema
    from prefect.utilities.schema_tools import ValidationError as SchemaError
    from prefect.utilities.schema_tools import validate

    from flows.pipeline import train_pipeline

    schema = parameter_schema(train_pipeline.fn).model_dump_for_openapi()
    options = schema["definitions"]["ImageTransformations"]["properties"]
    assert {"type": "boolean"} in options["random_rotation"]["anyOf"]
    assert "true: on with its defaults; false or empty: off" in options["random_rotation"]["description"]
    assert {"const": False, "type": "boolean"} in options["pad"]["anyOf"]  # its padding has no default

    switched = {"model": {"transformations": {"random_rotation": True, "random_crop": False}}}
    validate(switched, schema, raise_on_error=True)
    for wrong in ({"random_rotation": "yes"}, {"random_rotation": 1}, {"pad": True}):
        with pytest.raises(SchemaError, match=f"model.transformations.{next(iter(wrong))}"):
            validate({"model": {"transformations": wrong}}, schema, raise_on_error=True)

    model = train_pipeline.validate_parameters(switched)["model"]  # as the flow run takes them
    assert isinstance(model, ModelSpec) and model.transformations.random_rotation == RandomRotation()
    assert model.transformations.random_crop is None and model.transformations.resize == Resize()
    with pytest.raises(ValidationError, match="pad.padding"):
        ModelSpec(transformations={"pad": True})
