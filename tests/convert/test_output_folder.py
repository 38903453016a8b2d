"""The journal a conversion stopped part way goes on from: what it keeps of an earlier attempt, and what it lets go."""

from pathlib import Path

from tasks.contracts.image_directory import ImageRecord
from tasks.convert.output_folder import JOURNAL_NAME, StoredJournal
from tasks.convert.plan import SourceFile


def record(path: str, source: str, size: int, label: str = "cat") -> ImageRecord:
    return ImageRecord(
        path=path, label=label, sha256="0" * 64, size_bytes=size, width=1, height=1, mode="L", source_path=source
    )


def stored(root: Path, path: str, size: int) -> None:
    (root / path).parent.mkdir(parents=True, exist_ok=True)
    (root / path).write_bytes(b"x" * size)


def test_an_earlier_attempts_journal_is_kept_by_position_and_read_back_when_its_image_comes_up(tmp_path):
    lines = [
        record("cat/a.png", "photos/cat/a.png", 3),
        record("cat/b.png", "photos/cat/b.png", 9),  # stored again below: the later line wins
        record("cat/b.png", "photos/cat/B.png", 4),
        record("cat/c.png", "photos/cat/c.png", 7),  # its file is shorter than recorded: not kept
        record("cat/d.png", "photos/cat/d.png", 5),
    ]
    for path, size in (("cat/a.png", 3), ("cat/b.png", 4), ("cat/c.png", 2), ("cat/d.png", 5), ("cat/e.png", 1)):
        stored(tmp_path, path, size)
    text = "".join("\n" + line.model_dump_json() for line in lines) + '\n{"path": "cat/e.png", "lab'  # cut short
    (tmp_path / JOURNAL_NAME).write_text(text)

    journal = StoredJournal(tmp_path)
    assert journal.images == journal.reusable == 3 and journal.stored_bytes == 3 + 4 + 5
    assert sorted(p.name for p in (tmp_path / "cat").iterdir()) == ["a.png", "b.png", "d.png"]  # the rest: unfinished

    def file(name: str) -> SourceFile:
        stored(tmp_path / "src", name, 10)  # the source, as this attempt finds it
        return SourceFile(tmp_path / "src" / name, name, f"photos/cat/{name}", "cat")

    assert journal.take(file("a.png"), "cat/a.png") == lines[0]
    assert journal.take(file("B.png"), "cat/b.png") == lines[2]
    assert journal.take(file("x.png"), "cat/x.png") is None  # never stored
    # Planned for another file this time: the stored one goes, to be stored afresh, and is no longer counted.
    assert journal.take(file("other.png"), "cat/d.png") is None and not (tmp_path / "cat/d.png").exists()
    assert journal.images == 2 and journal.reusable == 0
    assert journal.attempt_bytes == 3 + 4 and journal.source_bytes == 10 + 10
    journal.add(record("cat/x.png", "photos/cat/x.png", 6), source_bytes=6)
    journal.remove()
    assert not (tmp_path / JOURNAL_NAME).exists() and journal.images == 3
