"""tasks/contracts/image_files.py: the names images and class folders are stored under, and the orientation read
from a photo's header. Conversions that store them: tests/convert/."""

import io

import pytest
from PIL import Image

from tasks.contracts import image_directory, image_files, image_manifest
from tasks.contracts.image_files import (
    EXIF_ORIENTATION,
    IMAGE_EXTENSIONS,
    class_folders,
    orientation_of,
    safe_name,
    stored_file_name,
)


@pytest.mark.parametrize(
    ("name", "safe"),
    [
        ("golden retriever", "golden retriever"),
        ("a/b:c", "a%2Fb%3Ac"),
        ("100%", "100%25"),
        (".hidden", "%2Ehidden"),
        ("dots.", "dots%2E"),
        ("CON", "%43ON"),
        ("lpt1.txt", "%6Cpt1.txt"),
        ("e\u0301t\u00e9", "\u00e9t\u00e9"),  # NFD becomes NFC
    ],
)
def test_a_name_is_made_safe_on_every_system_and_distinct_names_stay_distinct(name, safe):
    assert safe_name(name) == safe
    with pytest.raises(ValueError, match="empty"):
        safe_name("")


def test_class_folders_differing_only_in_case_get_a_number_and_phones_formats_a_jpg_name():
    assert class_folders(["Cat", "cat", "CAT", "dog"]) == {"Cat": "Cat", "cat": "cat~2", "CAT": "CAT~3", "dog": "dog"}
    assert stored_file_name("IMG_0001.HEIC") == "IMG_0001.HEIC.jpg" and stored_file_name("a.png") == "a.png"
    assert {".heic", ".avif", ".jpg", ".png"} <= IMAGE_EXTENSIONS and ".txt" not in IMAGE_EXTENSIONS


def saved(format: str, orientation: int | None) -> Image.Image:
    image, buffer = Image.new("RGB", (4, 2)), io.BytesIO()
    exif = Image.Exif()
    if orientation is not None:
        exif[EXIF_ORIENTATION] = orientation
    image.save(buffer, format=format, exif=exif)
    buffer.seek(0)
    return Image.open(buffer)


def test_the_orientation_comes_from_the_header_and_anything_but_1_to_8_is_upright():
    assert orientation_of(saved("JPEG", 6)) == 6
    assert orientation_of(saved("JPEG", None)) == 1
    assert orientation_of(saved("JPEG", 9)) == 1
    assert orientation_of(saved("PNG", 3)) == 3  # an eXIf chunk before the image data
    assert orientation_of(saved("PNG", None)) == 1


def test_every_name_of_the_split_modules_is_still_importable_from_image_directory():
    for module in (image_files, image_manifest):
        for name in set(vars(module)) & set(image_directory.__all__):
            assert getattr(image_directory, name) is getattr(module, name)
    assert {"safe_name", "orientation_of", "ImageRecord", "SplitRecord", "MANIFEST_NAME"} <= set(
        image_directory.__all__
    )
