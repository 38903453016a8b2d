import os

from tasks.convert.conversion import convert_to_image_directory
from tests.convert.sample_sources import reasons_by_path
from tests.helpers import COLOURS, write_image


def test_links_are_followed_only_inside_the_source_and_every_skipped_entry_is_reported(colour_source, tmp_path):
    outside = write_image(tmp_path / "private" / "secret.png", COLOURS["red"], seed=50)
    write_image(tmp_path / "elsewhere" / "purple_0.png", COLOURS["blue"], seed=51)
    red = colour_source / "red"
    (red / "alias.png").symlink_to("red_0.png")
    (colour_source / "verdant").symlink_to("green", target_is_directory=True)
    (red / "secret.png").symlink_to(outside)
    (colour_source / "purple").symlink_to(tmp_path / "elsewhere", target_is_directory=True)
    (red / "gone.png").symlink_to("no-such-file.png")
    (red / "loop").symlink_to("..", target_is_directory=True)
    os.mkfifo(red / "pipe.png")

    image_dir = convert_to_image_directory(colour_source, tmp_path / "out")

    manifest, reasons = image_dir.manifest, reasons_by_path(image_dir)
    assert manifest.counts == {"blue": 6, "green": 6, "red": 7, "verdant": 6}, "links inside the source are read"
    assert reasons["red/secret.png"].startswith(f"link to {str(outside)!r}, outside the source")
    assert reasons["purple"].startswith(f"link to {str(tmp_path / 'elsewhere')!r}, outside the source")
    assert reasons["red/gone.png"] == "broken link to 'no-such-file.png': its target does not exist"
    assert reasons["red/loop"].startswith("link to '..', a folder that holds it: following it would loop")
    assert reasons["red/pipe.png"].startswith("a FIFO, not a regular file")
    assert len(reasons) == 5 and "purple" not in manifest.classes
    assert any(w.startswith("5 hidden entries, links or special files were skipped") for w in manifest.warnings)
    assert not any("without images" in w for w in manifest.warnings), "a skipped folder link is no empty class"
    stored = {p.read_bytes() for p in (tmp_path / "out").rglob("*.png")}
    assert outside.read_bytes() not in stored, "nothing from outside the source is copied"
