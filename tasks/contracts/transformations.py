"""Image transformations: the options of Azure ML designer's "Init Image Transformation", as one typed object.

``ImageTransformations`` is saved in the model spec (so in the model directory and the registration) and renders as
a form in the Prefect UI. Training applies it whole; scoring, evaluation and the ONNX check apply only its
deterministic options (Azure's "Apply Image Transformation" for inference leaves the random ones out).
``tasks/vision/transforms.py`` builds the torchvision pipelines from it.

Options apply in the order of the fields below: first the deterministic ones, on the decoded image (their result is
cached across epochs), then, in training only, the random ones on uint8 pixels. An option is off when it is empty
(``None``) or ``False``; ``True`` switches one on with its defaults, in Python, on the command line and in a
deployment run's parameters alike: the JSON schema of each option (the Prefect server checks a run's parameters
against it, and the UI's form is built from it) offers the boolean beside the option's object, while the attribute
is always the option or ``None``. A size left empty means the training image size
(``TrainedModelSpec.image_size``: 224 px, or less for small images, e.g. 32 for the digits), so the defaults fit any
data set. The default object is what training always did: resize to the training size, then a random crop of that
size from the image padded by 1/8 of it, repeating the edge pixels.

Imports no torch: the flow's parameter form, the model directory and the registry read it.
"""

from __future__ import annotations

import math
from typing import Annotated, Any, Literal

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, model_validator

Interpolation = Literal["nearest", "bilinear", "bicubic"]
PaddingMode = Literal["constant", "edge", "reflect", "symmetric"]
Fill = Annotated[int, Field(ge=0, le=255, description="fill value (0-255) of the pixels outside the image")]
Side = Annotated[int, Field(ge=1)]
Fraction = Annotated[float, Field(ge=0, le=1)]
Probability = Annotated[float, Field(gt=0, le=1, description="probability of applying it to an image")]
_TRAINING_SIZE = "empty: the training image size"
_ON_OFF = "true: on with its defaults; false or empty: off"


def _ordered(pair: tuple[float, float], name: str, low: float, high: float) -> None:
    if not low <= pair[0] <= pair[1] <= high:
        raise ValueError(f"{name} {pair} is not allowed: give (min, max) with {low} <= min <= max <= {high}")


class _Option(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


def _on_off(value: Any) -> Any:
    return {} if value is True else None if value is False else value


def _switch(option: type[_Option]) -> BeforeValidator:
    """An option's field takes ``True`` (the option with its defaults) and ``False`` (off, as empty) too, and its
    JSON schema says so: ``anyOf [<option>, boolean, null]`` in validation mode, the schema the Prefect server checks
    a deployment run's parameters against. An option with a setting that has no default (``pad``) offers ``false``
    alone: ``true`` is refused there as in Python."""
    has_defaults = not any(field.is_required() for field in option.model_fields.values())
    return BeforeValidator(_on_off, json_schema_input_type=option | (bool if has_defaults else Literal[False]) | None)


class Resize(_Option):
    size: Side | None = Field(None, description=f"side in pixels; {_TRAINING_SIZE}")
    keep_aspect_ratio: bool = Field(
        False, description="resize the shorter side to size (needs center_crop); off: stretch to size x size"
    )
    interpolation: Interpolation = "bilinear"


class CenterCrop(_Option):
    size: Side | None = Field(None, description=f"side of the square kept from the centre; {_TRAINING_SIZE}")


class Pad(_Option):
    padding: Side = Field(description="pixels added on each side")
    padding_mode: PaddingMode = Field("constant", description="constant (fill), edge, reflect or symmetric")
    fill: Fill = 0


class RandomResizedCrop(_Option):
    size: Side | None = Field(None, description=f"side of the output; {_TRAINING_SIZE}")
    scale: tuple[float, float] = Field((0.08, 1.0), description="range of the cropped fraction of the image area")
    ratio: tuple[float, float] = Field((3 / 4, 4 / 3), description="range of the crop's width / height")
    interpolation: Interpolation = "bilinear"

    @model_validator(mode="after")
    def _ranges(self) -> RandomResizedCrop:
        _ordered(self.scale, "scale", 1e-6, 1.0)
        _ordered(self.ratio, "ratio", 1e-6, math.inf)
        return self


class RandomCrop(_Option):
    size: Side | None = Field(None, description=f"side of the crop; {_TRAINING_SIZE}")
    padding: float = Field(
        0.125,
        ge=0,
        le=1,
        description="padding on each side before cropping, as a fraction of the training image size, rounded down "
        "(0.125: 4 px at 32 px, 28 px at 224 px)",
    )
    padding_mode: PaddingMode = Field("edge", description="constant (fill), edge, reflect or symmetric")
    fill: Fill = 0

    def padding_px(self, image_size: int) -> int:
        # The epsilon keeps fractions like 0.3 of 10 px (2.9999...) from rounding down a whole pixel.
        return math.floor(image_size * self.padding + 1e-9)


class RandomFlip(_Option):
    p: Probability = 0.5


class RandomRotation(_Option):
    degrees: float = Field(15, gt=0, le=180, description="rotation drawn from [-degrees, degrees]")
    interpolation: Literal["nearest", "bilinear"] = "nearest"
    fill: Fill = 0


class RandomAffine(_Option):
    degrees: float = Field(0, ge=0, le=180, description="rotation drawn from [-degrees, degrees]")
    translate: tuple[Fraction, Fraction] | None = Field(
        (0.1, 0.1), description="largest shift as fractions of the width and height; empty: none"
    )
    scale: tuple[float, float] | None = Field(None, description="range of the scale factor; empty: 1")
    shear: float | None = Field(None, ge=0, le=90, description="shear along x drawn from [-shear, shear] degrees")
    interpolation: Literal["nearest", "bilinear"] = "nearest"
    fill: Fill = 0

    @model_validator(mode="after")
    def _moves(self) -> RandomAffine:
        if self.scale is not None:
            _ordered(self.scale, "scale", 1e-6, math.inf)
        if not (self.degrees or self.translate and any(self.translate) or self.scale or self.shear):
            raise ValueError("random_affine changes nothing: set degrees, translate, scale or shear")
        return self


class RandomPerspective(_Option):
    distortion_scale: float = Field(0.5, gt=0, le=1, description="how far corners may move (0-1)")
    p: Probability = 0.5
    interpolation: Literal["nearest", "bilinear"] = "bilinear"
    fill: Fill = 0


class ColorJitter(_Option):
    brightness: float = Field(0.4, ge=0, description="brightness factor drawn from [1 - b, 1 + b]")
    contrast: float = Field(0.4, ge=0, description="contrast factor drawn from [1 - c, 1 + c]")
    saturation: float = Field(0.4, ge=0, description="saturation factor drawn from [1 - s, 1 + s]")
    hue: float = Field(0.0, ge=0, le=0.5, description="hue shift drawn from [-h, h] (at most 0.5)")

    @model_validator(mode="after")
    def _changes_something(self) -> ColorJitter:
        if not (self.brightness or self.contrast or self.saturation or self.hue):
            raise ValueError("color_jitter changes nothing: set brightness, contrast, saturation or hue above 0")
        return self


class RandomGrayscale(_Option):
    p: Probability = 0.1


class RandomErasing(_Option):
    p: Probability = 0.5
    scale: tuple[float, float] = Field((0.02, 0.33), description="range of the erased fraction of the image area")
    ratio: tuple[float, float] = Field((0.3, 3.3), description="range of the erased rectangle's width / height")
    value: Literal["mean"] | tuple[Fill, Fill, Fill] = Field(
        "mean",
        description="colour of the erased rectangle: 'mean' (the normalisation mean, which becomes 0 once "
        "normalised, as torchvision's default on normalised images) or an RGB triple 0-255",
    )

    @model_validator(mode="after")
    def _ranges(self) -> RandomErasing:
        _ordered(self.scale, "scale", 1e-6, 1.0)
        _ordered(self.ratio, "ratio", 1e-6, math.inf)
        return self


DETERMINISTIC = ("resize", "center_crop", "pad", "grayscale")
RANDOM = (
    "random_resized_crop",
    "random_crop",
    "random_horizontal_flip",
    "random_vertical_flip",
    "random_rotation",
    "random_affine",
    "random_perspective",
    "color_jitter",
    "random_grayscale",
    "random_erasing",
)


class ImageTransformations(BaseModel):
    """Azure's "Init Image Transformation": deterministic options (training and inference), then random ones
    (training only), in this order. Empty or false = off; true = on with its defaults."""

    model_config = ConfigDict(extra="forbid")

    resize: Annotated[Resize | None, _switch(Resize)] = Field(
        default_factory=Resize,
        description=f"deterministic: resize (default: to the training size x the training size); {_ON_OFF}",
    )
    center_crop: Annotated[CenterCrop | None, _switch(CenterCrop)] = Field(
        None, description=f"deterministic: keep a centred square; {_ON_OFF}"
    )
    pad: Annotated[Pad | None, _switch(Pad)] = Field(
        None, description="deterministic: add a border (give its padding); false or empty: off"
    )
    grayscale: bool = Field(False, description="deterministic: grey levels (kept as 3 channels for the network)")
    random_resized_crop: Annotated[RandomResizedCrop | None, _switch(RandomResizedCrop)] = Field(
        None, description=f"training only: crop a random area and aspect ratio, resized to size; {_ON_OFF}"
    )
    random_crop: Annotated[RandomCrop | None, _switch(RandomCrop)] = Field(
        default_factory=RandomCrop,
        description=f"training only: crop at a random place of the padded image (default: padding 1/8, edge); "
        f"{_ON_OFF}",
    )
    random_horizontal_flip: Annotated[RandomFlip | None, _switch(RandomFlip)] = Field(
        None, description=f"training only: mirror left-right (not for digits, text, arrows...); {_ON_OFF}"
    )
    random_vertical_flip: Annotated[RandomFlip | None, _switch(RandomFlip)] = Field(
        None, description=f"training only: mirror top-bottom; {_ON_OFF}"
    )
    random_rotation: Annotated[RandomRotation | None, _switch(RandomRotation)] = Field(
        None, description=f"training only: rotate by a random angle; {_ON_OFF}"
    )
    random_affine: Annotated[RandomAffine | None, _switch(RandomAffine)] = Field(
        None, description=f"training only: random rotation, shift, scale and shear together; {_ON_OFF}"
    )
    random_perspective: Annotated[RandomPerspective | None, _switch(RandomPerspective)] = Field(
        None, description=f"training only: random perspective; {_ON_OFF}"
    )
    color_jitter: Annotated[ColorJitter | None, _switch(ColorJitter)] = Field(
        None, description=f"training only: random brightness, contrast, saturation and hue; {_ON_OFF}"
    )
    random_grayscale: Annotated[RandomGrayscale | None, _switch(RandomGrayscale)] = Field(
        None, description=f"training only: grey levels now and then; {_ON_OFF}"
    )
    random_erasing: Annotated[RandomErasing | None, _switch(RandomErasing)] = Field(
        None, description=f"training only: blank a random rectangle; {_ON_OFF}"
    )

    @model_validator(mode="before")
    @classmethod
    def _known_names(cls, data: Any) -> Any:
        """Unknown names are refused with the known ones (extra="forbid" alone would not list them)."""
        unknown = sorted(set(data) - set(DETERMINISTIC + RANDOM)) if isinstance(data, dict) else []
        if unknown:
            raise ValueError(f"unknown transformations {unknown}: the options are {', '.join(DETERMINISTIC + RANDOM)}")
        return data

    @model_validator(mode="after")
    def _fixed_size(self) -> ImageTransformations:
        if self.center_crop is None and (self.resize is None or self.resize.keep_aspect_ratio):
            raise ValueError(
                "images of different shapes cannot be batched: keep resize (to size x size) or add center_crop"
            )
        return self

    def for_inference(self) -> ImageTransformations:
        """The deterministic options only: what scoring, evaluation and the ONNX check apply."""
        return self.model_copy(update=dict.fromkeys(RANDOM))

    def random_options(self) -> list[str]:
        return [name for name in RANDOM if getattr(self, name) is not None]

    def decoded_side(self, image_size: int) -> int:
        """The side of the square the deterministic options make (the inference input's side)."""
        side = image_size if self.resize is None or self.resize.size is None else self.resize.size
        if self.center_crop is not None:
            side = self.center_crop.size or image_size
        return side + (2 * self.pad.padding if self.pad else 0)

    def training_side(self, image_size: int) -> int:
        """The side of the training images (after the random crops)."""
        if self.random_crop is not None:
            return self.random_crop.size or image_size
        if self.random_resized_crop is not None:
            return self.random_resized_crop.size or image_size
        return self.decoded_side(image_size)

    def check_sizes(self, image_size: int) -> None:
        """Raise ValueError when a random crop asks for more than the image it gets, at this training size."""
        crop = self.random_crop
        if crop is None:
            return
        if self.random_resized_crop is not None:
            side = self.random_resized_crop.size or image_size
        else:
            side = self.decoded_side(image_size)
        if (crop.size or image_size) > side + 2 * crop.padding_px(image_size):
            raise ValueError(
                f"random_crop of {crop.size or image_size} px cannot fit the {side} px image padded by "
                f"{crop.padding_px(image_size)} px on each side (training size {image_size} px): "
                "give a smaller size or more padding"
            )

    def describe(self, image_size: int | None = None) -> str:
        """One line, in application order, e.g. "resize to 32x32, random crop 32 px, padding 4 px (edge)"."""

        def px(size: int | None) -> str:
            size = size or image_size
            return f"{size}x{size}" if size else "the training size"

        parts = []
        if self.resize:
            how = "shorter side to " + str(self.resize.size or image_size or "the training size")
            parts.append(f"resize {how if self.resize.keep_aspect_ratio else 'to ' + px(self.resize.size)}")
        if self.center_crop:
            parts.append(f"center crop {px(self.center_crop.size)}")
        if self.pad:
            parts.append(f"pad {self.pad.padding} px ({self.pad.padding_mode})")
        if self.grayscale:
            parts.append("grayscale")
        if self.random_resized_crop:
            parts.append(f"random resized crop {px(self.random_resized_crop.size)}")
        if self.random_crop:
            crop = self.random_crop
            padding = f"{crop.padding_px(image_size)} px" if image_size else f"{crop.padding:g} of the size"
            parts.append(f"random crop {px(crop.size)}, padding {padding} ({crop.padding_mode})")
        for name in RANDOM[2:]:
            if getattr(self, name) is not None:
                parts.append(name.replace("_", " "))
        return ", ".join(parts)
