"""The limits of one conversion: defaults that take a phone's photos, and only positive bounds."""

import pytest
from pydantic import ValidationError

from tasks.contracts.conversion_limits import ConversionLimits


def test_the_default_limits_take_a_48_megapixel_photo_and_refuse_pillows_bombs():
    limits = ConversionLimits()
    assert 8000 * 6000 <= limits.max_image_pixels < 89_478_485  # Pillow's DecompressionBombWarning
    assert limits.decode_memory_bytes >= 8000 * 6000 * 3, "one such photo decoded fits"


@pytest.mark.parametrize("field", ["max_extracted_bytes", "max_image_pixels", "decode_memory_bytes"])
def test_a_bound_that_is_not_positive_is_refused_naming_it(field):
    with pytest.raises(ValidationError) as refused:
        ConversionLimits(**{field: 0})
    assert [error["loc"] for error in refused.value.errors()] == [(field,)]
