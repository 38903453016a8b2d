import base64

from tasks.markdown import png_markdown, png_markdown_of

PNG = b"\x89PNG\r\n\x1a\nnot really a picture"


def test_a_png_is_inline_as_a_data_uri_from_bytes_or_a_file(tmp_path):
    line = png_markdown_of(PNG, "loss by epoch")
    assert line.startswith("![loss by epoch](data:image/png;base64,") and line.endswith(")")
    assert base64.b64decode(line.split(",", 1)[1][:-1]) == PNG
    (tmp_path / "curves.png").write_bytes(PNG)
    assert png_markdown(tmp_path / "curves.png", "loss by epoch") == line
