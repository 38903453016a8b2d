"""A set of image transformations that turns every option on, for the transformation tests."""

from tasks.contracts.transformations import RANDOM, ImageTransformations

EVERY_OPTION = ImageTransformations(
    resize={"size": 20, "keep_aspect_ratio": True},
    center_crop={"size": 18},
    pad={"padding": 1, "padding_mode": "reflect"},
    grayscale=True,
    **dict.fromkeys(RANDOM, True),
)
