"""Archives as Convert to Image Directory sources, including the hostile ones (S3 prefixes: test_s3_source.py)."""

import bz2
import gzip
import io
import stat
import tarfile
import zipfile
from pathlib import Path

import pytest

from tasks.convert.conversion import convert_to_image_directory
from tasks.errors import InvalidDatasetError
from tests.convert.sample_sources import tar_bytes
from tests.helpers import COLOURS


@pytest.mark.parametrize("name", ["set.tar", "set.tar.gz", "set.tgz", "set.tar.bz2", "set.gz", "SET.TAR.XZ"])
def test_tar_archives_in_every_compression_find_the_class_folders(colour_source, tmp_path, name):
    plain = tar_bytes(colour_source, "outer/inner/photos")
    compress = {
        "set.tar": bytes,
        "set.tar.gz": gzip.compress,
        "set.tgz": gzip.compress,
        "set.tar.bz2": bz2.compress,
        "set.gz": gzip.compress,
    }.get(name)
    archive = tmp_path / name
    archive.write_bytes(compress(plain) if compress else tar_bytes(colour_source, "outer/photos", "w:xz"))
    image_dir = convert_to_image_directory(archive, tmp_path / "out")
    assert image_dir.manifest.counts == {c: 6 for c in COLOURS} and image_dir.manifest.quarantined == []
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted([name, "out", "source"]), "nothing left beside output"


def evil_tar(path: Path, member: tarfile.TarInfo, data: bytes = b"") -> Path:
    with tarfile.open(path, "w:gz") as archive:
        good = tarfile.TarInfo("cats/ok.png")
        good.size = 3
        archive.addfile(good, io.BytesIO(b"png"))
        archive.addfile(member, io.BytesIO(data) if member.isfile() else None)
    return path


def tar_member(name: str, kind: bytes = tarfile.REGTYPE, link: str = "", data: bytes = b"") -> tarfile.TarInfo:
    member = tarfile.TarInfo(name)
    member.type, member.linkname, member.size = kind, link, len(data)
    return member


@pytest.mark.parametrize(
    ("member", "message"),
    [
        (tar_member("../../escaped.png", data=b"x"), "points outside the archive"),
        (tar_member("/tmp/absolute.png", data=b"x"), "points outside the archive"),
        (tar_member("cats/passwd.png", tarfile.SYMTYPE, "../../../etc/passwd"), "link to '../../../etc/passwd'"),
        (tar_member("cats/abs.png", tarfile.SYMTYPE, "/etc/passwd"), "link to '/etc/passwd', outside the archive"),
        (tar_member("cats/hard.png", tarfile.LNKTYPE, "../../outside.png"), "link to '../../outside.png', outside"),
    ],
    ids=["dot-dot", "absolute", "symlink-out", "symlink-absolute", "hardlink-out"],
)
def test_hostile_tar_members_are_refused_and_nothing_escapes(tmp_path, scratch, member, message):
    archive = evil_tar(tmp_path / "evil.tar.gz", member, b"x" * member.size)
    with pytest.raises(InvalidDatasetError, match=message):
        convert_to_image_directory(archive, tmp_path / "deep" / "out")
    assert sorted(p.name for p in tmp_path.rglob("*")) == ["evil.tar.gz", "scratch"]


def zip_with(path: Path, entries: dict[str, bytes], links: dict[str, str] | None = None) -> Path:
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as archive:
        for name, data in entries.items():
            archive.writestr(name, data)
        for name, target in (links or {}).items():
            info = zipfile.ZipInfo(name)
            info.external_attr = (stat.S_IFLNK | 0o777) << 16
            archive.writestr(info, target)
    return path


def test_hostile_zip_members_are_refused_and_nothing_escapes(colour_source, tmp_path, scratch):
    png = (colour_source / "red" / "red_0.png").read_bytes()
    cases = {
        "slip.zip": ({"cats/a.png": png, "../../escaped.png": png}, {}, "points outside the archive"),
        "absolute.zip": ({"cats/a.png": png, "/tmp/absolute.png": png}, {}, "points outside the archive"),
        "windows.zip": ({"cats/a.png": png, "..\\..\\escaped.png": png}, {}, "points outside the archive"),
        "link.zip": ({"cats/a.png": png}, {"cats/b.png": "../../../etc/passwd"}, "is a link to '../../../etc/passwd'"),
    }
    for name, (entries, links, message) in cases.items():
        with pytest.raises(InvalidDatasetError, match=message):
            convert_to_image_directory(zip_with(tmp_path / name, entries, links), tmp_path / "deep" / "out")
    assert not (tmp_path / "deep").exists() and list(scratch.iterdir()) == []
    assert not list(tmp_path.rglob("escaped.png")) and not list(tmp_path.rglob("absolute.png"))


def test_zip_link_inside_the_archive_is_quarantined_not_followed(colour_source, tmp_path):
    png = (colour_source / "red" / "red_0.png").read_bytes()
    archive = zip_with(tmp_path / "links.zip", {"cats/a.png": png, "dogs/b.png": png}, {"dogs/c.png": "../cats/a.png"})
    image_dir = convert_to_image_directory(archive, tmp_path / "out")
    assert image_dir.manifest.counts == {"cats": 1, "dogs": 1}
    assert [q.path for q in image_dir.manifest.quarantined] == ["dogs/c.png"]
    assert "links in archives are not followed" in image_dir.manifest.quarantined[0].reason


def test_archive_bombs_over_the_declared_size_cap_are_refused(tmp_path):
    zeros = b"\0" * (2 << 20)  # compresses to ~2 kB: a ratio of 1000, as bombs have
    bomb_zip = zip_with(tmp_path / "bomb.zip", {f"cats/{i}.png": zeros for i in range(3)})
    bomb_tar = tmp_path / "bomb.tar.gz"
    with tarfile.open(bomb_tar, "w:gz") as archive:
        for i in range(3):
            archive.addfile(tar_member(f"cats/{i}.png", data=zeros), io.BytesIO(zeros))
    assert bomb_zip.stat().st_size < 64 << 10 and bomb_tar.stat().st_size < 64 << 10
    for bomb in (bomb_zip, bomb_tar):
        with pytest.raises(InvalidDatasetError, match="over the limit of 4,194,304 bytes"):
            convert_to_image_directory(bomb, tmp_path / "out", max_extracted_bytes=4 << 20)
    assert not (tmp_path / "out").exists()


def test_damaged_archives_and_other_files_are_clear_errors(colour_source, tmp_path):
    whole = tar_bytes(colour_source, "photos", "w:gz")
    (tmp_path / "cut.tar.gz").write_bytes(whole[: len(whole) // 2])
    (tmp_path / "notes.txt").write_text("not an archive")
    with pytest.raises(InvalidDatasetError, match="gzip-compressed tar archive but is damaged or truncated"):
        convert_to_image_directory(tmp_path / "cut.tar.gz", tmp_path / "out")
    with pytest.raises(InvalidDatasetError, match=r"neither a folder nor an archive this stage reads \(\.zip, \.tar"):
        convert_to_image_directory(tmp_path / "notes.txt", tmp_path / "out")
