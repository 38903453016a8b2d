"""The perceptual hash on real photographs: copies close, different pictures far, tiny images not hashed, and the
hash conversion stores (read off a JPEG's reduced decode) the same as the full image's."""

import io

import numpy as np
import pytest
from PIL import Image

from tasks.convert.conversion import convert_to_image_directory
from tasks.near_duplicates import DEFAULT_DISTANCE, MIN_SIDE, hamming, perceptual_hash
from tests.helpers import sample_photos, write_burst, write_crops


def bits_apart(a: Image.Image, b: Image.Image) -> int:
    return int(hamming(np.uint64(perceptual_hash(a)), np.uint64(perceptual_hash(b))))


def test_copies_of_a_photo_are_close_and_different_photos_far():
    photos = sample_photos()
    for photo in photos.values():
        half = photo.resize((photo.width // 2, photo.height // 2), Image.Resampling.LANCZOS)
        buffer = io.BytesIO()
        half.save(buffer, format="JPEG", quality=40)
        assert bits_apart(photo, half) <= DEFAULT_DISTANCE
        assert bits_apart(photo, Image.open(buffer)) <= DEFAULT_DISTANCE
    names = list(photos)
    for i, a in enumerate(names):
        for b in names[i + 1 :]:
            assert bits_apart(photos[a], photos[b]) > 2 * DEFAULT_DISTANCE, (a, b)


@pytest.mark.parametrize("mode", ["RGB", "L", "P", "CMYK", "RGBA", "LA", "I;16", "1"])
def test_every_mode_hashes_and_an_image_too_small_gets_none(mode):
    photo = sample_photos()["flower"].convert(mode)
    assert perceptual_hash(photo) != 0
    assert perceptual_hash(photo.resize((MIN_SIDE - 1, 64))) == 0


def test_conversion_stores_the_hash_of_what_it_stored(tmp_path):
    photos = sample_photos()
    burst = write_burst(tmp_path / "photos" / "china", "china", photos["china"])
    others = write_crops(tmp_path / "photos" / "flower", "flower", photos["flower"])
    converted = convert_to_image_directory(tmp_path / "photos", tmp_path / "converted")

    index = converted.index
    stored = {index.path[i]: int(index.perceptual_hash[i]) for i in range(len(index))}
    assert set(stored) == set(burst + others) and all(stored.values())
    for path, value in stored.items():  # JPEGs are hashed from their reduced (draft) decode; PNGs whole
        with Image.open(converted.root / path) as image:
            assert int(hamming(np.uint64(value), np.uint64(perceptual_hash(image)))) <= 2, path
