"""Archives unpacked by tasks.convert.archives: links never made, damage never read as a shorter archive."""

import bz2
import gzip
import io
import lzma
import os
import struct
import tarfile
import zipfile
from pathlib import Path

import pytest

from tasks.convert.conversion import convert_to_image_directory
from tasks.errors import InvalidDatasetError
from tasks.storage.local_files import sha256_file
from tests.helpers import write_image


@pytest.fixture
def png(tmp_path) -> bytes:
    return write_image(tmp_path / "made" / "one.png", (200, 30, 30)).read_bytes()


def images(tmp_path: Path, count: int) -> list[bytes]:
    return [write_image(tmp_path / "made" / f"{i}.png", (30, 40, 220), seed=i).read_bytes() for i in range(count)]


def add(archive: tarfile.TarFile, name: str, data: bytes | None = None, kind: bytes = tarfile.REGTYPE, link: str = ""):
    member = tarfile.TarInfo(name)
    member.type, member.linkname, member.size = kind, link, len(data or b"")
    archive.addfile(member, io.BytesIO(data) if data is not None else None)


def everything_below(folder: Path) -> list[str]:
    return sorted(p.relative_to(folder).as_posix() for p in folder.rglob("*"))


def test_cve_2025_4517_link_chain_writes_nothing_outside_and_every_link_is_reported(tmp_path, scratch, png):
    # tarfile's data filter before the 2025 fixes (3.11.7 here) checks each link with os.path.realpath, which
    # stops expanding once the path passes PATH_MAX: a chain of long folder names lets a link point anywhere
    # while it looks inside. Python's own extraction writes tmp_path/escaped.png from this archive.
    extracted_at = len(os.fsencode(scratch / "convert-12345678" / "files"))  # tempfile names are 8 characters
    steps = "abcdefghijklmnop"
    long = "d" * ((os.pathconf(scratch, "PC_PATH_MAX") - extracted_at - 1) // (len(steps) + 1))
    archive_path = tmp_path / "chain.tar"
    with tarfile.open(archive_path, "w") as archive:
        for name in ("red/0.png", "blue/0.png"):
            add(archive, name, png)
        folder = ""
        for step in steps:
            add(archive, f"{folder}{long}", kind=tarfile.DIRTYPE)
            add(archive, f"{folder}{step}", kind=tarfile.SYMTYPE, link=long)
            folder += f"{long}/"
        beyond = "/".join(steps) + "/" + "l" * 254  # expands past PATH_MAX: never checked by realpath
        add(archive, beyond, kind=tarfile.SYMTYPE, link="/".join([".."] * len(steps)))
        # The chain resolves to the extraction folder itself; three more steps up is tmp_path.
        add(archive, "escape", kind=tarfile.SYMTYPE, link=f"{beyond}/../../..")
        add(archive, "escape/escaped.png", png)
    before = sha256_file(archive_path)

    image_dir = convert_to_image_directory(archive_path, tmp_path / "out")

    outputs = ["out", *(f"out/{name}" for name in everything_below(tmp_path / "out"))]
    assert everything_below(tmp_path) == sorted(["chain.tar", "made", "made/one.png", "scratch", *outputs]), (
        "nothing written outside the output and the temporary folder, which is gone"
    )
    assert sha256_file(archive_path) == before
    assert image_dir.manifest.counts == {"blue": 1, "red": 1}
    reasons = {q.path: q.reason for q in image_dir.manifest.quarantined}
    links = [f"{long}/" * i + step for i, step in enumerate(steps)] + ["escape"]
    assert sorted(reasons) == sorted([*links, beyond, "escape/escaped.png"])
    assert all(reasons[name].startswith("symbolic link to") and "not followed" in reasons[name] for name in links)
    assert reasons[beyond] == "lies below 'a', a link that is not followed"
    assert reasons["escape/escaped.png"] == "lies below 'escape', a link that is not followed"


def test_tar_links_devices_and_files_below_links_are_reported_and_never_made(tmp_path, png):
    archive_path = tmp_path / "links.tar.gz"
    with tarfile.open(archive_path, "w:gz") as archive:
        add(archive, "cats/a.png", png)
        add(archive, "dogs/b.png", png)
        add(archive, "dogs/soft.png", kind=tarfile.SYMTYPE, link="../cats/a.png")
        add(archive, "dogs/hard.png", kind=tarfile.LNKTYPE, link="cats/a.png")
        add(archive, "dogs/pipe.png", kind=tarfile.FIFOTYPE)
        add(archive, "more", kind=tarfile.SYMTYPE, link="dogs")
        add(archive, "more/c.png", png)
    image_dir = convert_to_image_directory(archive_path, tmp_path / "out")
    assert image_dir.manifest.counts == {"cats": 1, "dogs": 1}
    assert {q.path: q.reason for q in image_dir.manifest.quarantined} == {
        "dogs/soft.png": "symbolic link to '../cats/a.png': links in archives are not followed",
        "dogs/hard.png": "hard link to 'cats/a.png': links in archives are not followed",
        "dogs/pipe.png": "not a regular file (a device or pipe): only files and folders are unpacked",
        "more": "symbolic link to 'dogs': links in archives are not followed",
        "more/c.png": "lies below 'more', a link that is not followed",
    }
    assert not any(p.is_symlink() for p in (tmp_path / "out").rglob("*"))


def five_image_tar(tmp_path: Path) -> bytes:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as archive:
        for i, data in enumerate(images(tmp_path, 5)):
            add(archive, f"{'red' if i < 3 else 'blue'}/{i}.png", data)
    return buffer.getvalue()


@pytest.mark.parametrize("name", ["set.tar", "set.tar.gz", "set.tar.xz"])
def test_tar_with_a_damaged_header_is_refused_not_read_as_a_shorter_archive(tmp_path, scratch, name):
    tar = bytearray(five_image_tar(tmp_path))
    third = [m.offset for m in tarfile.open(fileobj=io.BytesIO(bytes(tar))).getmembers()][2]
    tar[third + 148 : third + 156] = b"0000000\0"  # its checksum no longer matches
    with tarfile.open(fileobj=io.BytesIO(bytes(tar))) as damaged:
        assert len(damaged.getmembers()) == 2, "tarfile alone reads two images and says nothing"
    compress = {"set.tar": bytes, "set.tar.gz": gzip.compress, "set.tar.xz": lzma.compress}
    (tmp_path / name).write_bytes(compress[name](bytes(tar)))
    with pytest.raises(InvalidDatasetError, match=rf"header at byte {third:,} .* 2 members were read before it"):
        convert_to_image_directory(tmp_path / name, tmp_path / "out")
    assert not (tmp_path / "out").exists() and list(scratch.iterdir()) == []


def test_zip_made_on_windows_with_backslashes_finds_the_class_folders(tmp_path, png):
    archive_path = tmp_path / "windows.zip"
    with zipfile.ZipFile(archive_path, "w") as archive:
        archive.writestr("export\\", b"")
        for name in ("export\\cat\\1.png", "export\\cat\\2.png", "export\\dog\\1.png"):
            archive.writestr(name, png)
    image_dir = convert_to_image_directory(archive_path, tmp_path / "out")
    assert image_dir.labeled and image_dir.manifest.counts == {"cat": 2, "dog": 1}
    assert sorted(r.path for r in image_dir.records()) == ["cat/1.png", "cat/2.png", "dog/1.png"]


def zip_bytes(entries: dict[str, bytes]) -> bytes:
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", zipfile.ZIP_DEFLATED) as archive:
        for name, data in entries.items():
            archive.writestr(name, data)
    return buffer.getvalue()


def tar_bytes(entries: dict[str, bytes | str], mode: str = "w") -> bytes:
    """Files (bytes) and hard links (str: the target) in a tar."""
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode=mode) as archive:
        for name, data in entries.items():
            if isinstance(data, str):
                add(archive, name, kind=tarfile.LNKTYPE, link=data)
            else:
                add(archive, name, data)
    return buffer.getvalue()


def rewrite_zip_headers(data: bytes, layout: str, value: int, local_at: int, central_at: int) -> bytes:
    """One field of every member's local header and central directory entry set to ``value``."""
    patched = bytearray(data)
    for signature, at in ((b"PK\x03\x04", local_at), (b"PK\x01\x02", central_at)):
        start = 0
        while (start := patched.find(signature, start)) >= 0:
            struct.pack_into(layout, patched, start + at, value)
            start += 4
    return bytes(patched)


def damaged_in_the_middle(data: bytes) -> bytes:
    middle = len(data) // 2
    return data[:middle] + bytes(b ^ 0x5A for b in data[middle : middle + 64]) + data[middle + 64 :]


def broken_archives(tmp_path: Path) -> dict[str, tuple[bytes, str]]:
    """Archive name -> (its bytes, what the refusal must say)."""
    pictures = images(tmp_path, 6)
    set_of_six = {f"{'red' if i % 2 else 'blue'}/{i}.png": data for i, data in enumerate(pictures)}
    long_name = "é" * 130 + ".png"  # 264 bytes in UTF-8
    whole_zip = zip_bytes(set_of_six)
    zstd_zip = rewrite_zip_headers(whole_zip, "<H", 93, local_at=8, central_at=10)  # compression method: zstd
    return {
        "damaged.tar.xz": (
            damaged_in_the_middle(tar_bytes(set_of_six, "w:xz")),
            "looks like a xz-compressed tar archive but is damaged or truncated",
        ),
        "damaged.tar.bz2": (
            damaged_in_the_middle(tar_bytes(set_of_six, "w:bz2")),
            "looks like a bzip2-compressed tar archive but is damaged or truncated",
        ),
        "truncated.zip": (whole_zip[: len(whole_zip) * 2 // 3], "looks like a zip archive but is damaged or truncated"),
        "hardlink.tar": (
            tar_bytes({**set_of_six, "red/copy.png": "red/missing.png"}),
            "hard link to 'red/missing.png', which no earlier member of the archive is",
        ),
        "clash.zip": (
            zip_bytes({"a": pictures[0], "a/b.png": pictures[1], **set_of_six}),
            "the archive holds 'a' both as a file and as a folder",
        ),
        "clash.tar": (
            tar_bytes({"red/x/1.png": pictures[0], "red/x": pictures[1], **set_of_six}),
            "the archive holds 'red/x' both as a file and as a folder",
        ),
        "long-name.zip": (
            zip_bytes({**set_of_six, f"red/{long_name}": pictures[0]}),
            "is 264 bytes long, over the 255 bytes a file system allows in one name",
        ),
        "long-name.tar.gz": (
            tar_bytes({**set_of_six, f"{long_name[:-4]}/1.png": pictures[0]}, "w:gz"),
            "is 260 bytes long, over the 255 bytes a file system allows in one name",
        ),
        "zstd.zip": (bytes(zstd_zip), "compression method is not supported; re-pack it with deflate, bzip2 or lzma"),
        "deep.tar": (
            tar_bytes({**set_of_six, "/".join(["d" * 250] * 20) + "/1.png": pictures[0]}),
            "a member's path is too long for this file system .File name too long.",
        ),
    }


BROKEN = [
    "damaged.tar.xz",
    "damaged.tar.bz2",
    "truncated.zip",
    "hardlink.tar",
    "clash.zip",
    "clash.tar",
    "long-name.zip",
    "long-name.tar.gz",
    "zstd.zip",
    "deep.tar",
]


@pytest.mark.parametrize("name", BROKEN)
def test_broken_archives_are_typed_errors_saying_what_is_wrong(tmp_path, scratch, name):
    data, message = broken_archives(tmp_path)[name]
    (tmp_path / name).write_bytes(data)
    with pytest.raises(InvalidDatasetError, match=message):
        convert_to_image_directory(tmp_path / name, tmp_path / "out")
    assert not (tmp_path / "out").exists() and list(scratch.iterdir()) == []
    assert (tmp_path / name).read_bytes() == data


def test_zip_understating_its_sizes_writes_no_more_than_it_declares(tmp_path, scratch):
    zeros = b"\0" * (8 << 20)
    data = zip_bytes({"cats/a.png": zeros, "cats/b.png": zeros})
    data = rewrite_zip_headers(data, "<I", 1024, local_at=22, central_at=24)  # uncompressed size: 1 kB each
    archive_path = tmp_path / "liar.zip"
    archive_path.write_bytes(data)
    with pytest.raises(InvalidDatasetError, match="looks like a zip archive but is damaged or truncated: Bad CRC-32"):
        convert_to_image_directory(archive_path, tmp_path / "out", max_extracted_bytes=1 << 20)
    assert not (tmp_path / "out").exists() and list(scratch.iterdir()) == []


def test_a_gz_of_text_or_a_text_file_named_like_an_archive_is_refused_as_damaged(tmp_path):
    (tmp_path / "notes.tar.bz2").write_bytes(bz2.compress(b"not a tar at all"))
    (tmp_path / "notes.zip").write_text("not a zip")
    for name, kind in (("notes.tar.bz2", "bzip2-compressed tar"), ("notes.zip", "zip")):
        with pytest.raises(InvalidDatasetError, match=f"looks like a {kind} archive but is damaged or truncated"):
            convert_to_image_directory(tmp_path / name, tmp_path / "out")
