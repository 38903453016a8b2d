import numpy as np

from tasks.contracts.image_index import INDEX_NAME, ImageIndex
from tasks.contracts.index_writer import IndexWriter
from tests.contracts.index_rows import rows


def test_a_written_index_reads_back_row_for_row_and_relabelled(tmp_path):
    written = rows(10_000)  # more than the writer's buffer: several flushes
    writer = IndexWriter(tmp_path / INDEX_NAME)
    for row in written:
        writer.append(row)
    assert writer.count == 10_000
    writer.relabel = np.array([0, 0, 1], dtype=np.int32)  # class 1 left out: 2 becomes 1
    digest, content_hash = writer.finish(["x", "y"])
    assert content_hash is None  # not in path order: the caller hashes the index, sorted
    assert [p.name for p in tmp_path.iterdir()] == [INDEX_NAME]  # the scratch folder went
    index = ImageIndex.open(tmp_path / INDEX_NAME)
    assert isinstance(index.label, np.memmap) and len(index) == 10_000
    assert np.load(tmp_path / INDEX_NAME)["label"].tolist() == index.label.tolist()  # an ordinary .npz
    expected = [r._replace(label=[0, 0, 1][r.label]) for r in written]
    assert [index.row(i) for i in range(0, 10_000, 997)] == expected[::997]
    assert list(index.path) == [r.path for r in written]
    assert ImageIndex.from_rows(written).save(tmp_path / "again.npz") != digest  # the labels differ


def test_rows_written_in_path_order_are_hashed_as_they_are_copied_to_the_same_content_hash(tmp_path):
    written = sorted(rows(10_000), key=lambda r: r.path.encode())
    writer = IndexWriter(tmp_path / INDEX_NAME)
    for row in written:
        writer.append(row)
    writer.relabel = np.array([0, -1, 1], dtype=np.int32)
    _, content_hash = writer.finish(["x", "z"])
    relabelled = [r._replace(label=[0, -1, 1][r.label]) for r in written]
    assert content_hash == ImageIndex.open(tmp_path / INDEX_NAME).content_hash(["x", "z"])
    assert content_hash == ImageIndex.from_rows(relabelled[::-1]).content_hash(["x", "z"])  # order-free
    assert content_hash != ImageIndex.from_rows(relabelled).content_hash(["x", "y"])
