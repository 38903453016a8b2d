import pytest

from tasks.convert.conversion import convert_to_image_directory
from tasks.errors import InvalidDatasetError
from tests.convert.sample_sources import write_flat


def test_labels_files_that_cannot_be_used_are_clear_errors(tmp_path):
    write_flat(tmp_path / "flat", {"a.png": "red", "b.png": "blue"})
    cases = {
        "wrong.csv": ("file,class\na.png,red\n", "needs an 'image' and a 'label' column"),
        "nothing.csv": ("image,label\nx.png,red\ny.png,blue\n", "none of the 2 images named in the labels file"),
        "twice.csv": ("image,label\na.png,red\na.png,blue\n", "gives 'a.png' two labels, 'red' and 'blue'"),
        "list.json": ('["a.png", "red"]', "must be one JSON object"),
    }
    for name, (text, message) in cases.items():
        (tmp_path / name).write_text(text)
        with pytest.raises(InvalidDatasetError, match=message):
            convert_to_image_directory(tmp_path / "flat", tmp_path / "out", labels=str(tmp_path / name))
    with pytest.raises(InvalidDatasetError, match="does not exist"):
        convert_to_image_directory(tmp_path / "flat", tmp_path / "out", labels=str(tmp_path / "missing.csv"))
    assert not (tmp_path / "out").exists()


def test_labels_files_in_common_encodings_are_read_and_others_named(tmp_path):
    write_flat(tmp_path / "flat", {"a.png": "red", "b.png": "blue"})
    text = "image,label\na.png,café\nb.png,thé\n"
    encodings = {
        "cp1252.csv": text.encode("cp1252"),
        "utf16.csv": text.encode("utf-16"),
        "bom.csv": text.encode("utf-8-sig"),
        "utf32.csv": text.encode("utf-32"),
    }
    for name, data in encodings.items():
        (tmp_path / name).write_bytes(data)
        image_dir = convert_to_image_directory(tmp_path / "flat", tmp_path / f"out-{name}", labels=str(tmp_path / name))
        assert image_dir.classes == ["café", "thé"], name
    (tmp_path / "nobom.csv").write_bytes(text.encode("utf-16-le"))
    with pytest.raises(InvalidDatasetError, match="NUL bytes: UTF-16 without a byte-order mark.*Accepted: UTF-8"):
        convert_to_image_directory(tmp_path / "flat", tmp_path / "out", labels=str(tmp_path / "nobom.csv"))
    (tmp_path / "bad.csv").write_bytes(b"image,label\na.png,\x81\n")
    with pytest.raises(InvalidDatasetError, match=r"neither UTF-8 nor Windows-1252 \(byte 0x81 at offset 18\)"):
        convert_to_image_directory(tmp_path / "flat", tmp_path / "out", labels=str(tmp_path / "bad.csv"))
