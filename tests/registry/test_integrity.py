"""The sha256 memo: a file is hashed once while it stays as it was, and any change (even one that keeps its size
and restores its modification time) is found."""

import hashlib
import os

import tasks.registry.integrity as integrity
from tasks.registry.integrity import memo_path, mismatched_files, remember


def test_unchanged_files_are_trusted_from_the_memo_and_any_change_is_found(tmp_path, monkeypatch):
    folder = tmp_path / "model"
    folder.mkdir()
    (folder / "model.pt").write_bytes(b"weights")
    expected = {"model.pt": hashlib.sha256(b"weights").hexdigest(), "classes.json": "0" * 64}
    memo = memo_path(tmp_path / "cache", "m", 1)
    hashed = []
    real_sha256 = integrity.sha256_file
    monkeypatch.setattr(integrity, "sha256_file", lambda path: hashed.append(path.name) or real_sha256(path))

    assert mismatched_files(folder, expected, memo) == {"classes.json": "missing"}
    assert mismatched_files(folder, expected, memo) == {"classes.json": "missing"}
    assert hashed == ["model.pt"], "hashed once, then trusted from the memo"

    stat = (folder / "model.pt").stat()
    (folder / "model.pt").write_bytes(b"WEIGHTS")  # same size
    os.utime(folder / "model.pt", ns=(stat.st_atime_ns, stat.st_mtime_ns))  # same mtime: the ctime still moves
    assert mismatched_files(folder, expected, memo) == {
        "classes.json": "missing",
        "model.pt": f"sha256 {hashlib.sha256(b'WEIGHTS').hexdigest()}",
    }


def test_hashes_remembered_after_a_download_are_not_computed_again(tmp_path, monkeypatch):
    (tmp_path / "a.bin").write_bytes(b"a")
    digest = hashlib.sha256(b"a").hexdigest()
    memo = tmp_path / "memo.json"
    remember(tmp_path, {"a.bin": digest}, memo)
    monkeypatch.setattr(integrity, "sha256_file", lambda path: (_ for _ in ()).throw(AssertionError("hashed")))
    assert mismatched_files(tmp_path, {"a.bin": digest}, memo) == {}
    memo.write_text("not json")  # a damaged memo only costs hashing again
    monkeypatch.undo()
    assert mismatched_files(tmp_path, {"a.bin": digest}, memo) == {}
