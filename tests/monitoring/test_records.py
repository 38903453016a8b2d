"""tasks/monitoring/records.py and recorder.py: records published in whole segments that pandas reads as they are;
a damaged segment skipped and named, another model's records left out; the recorder never blocks, and drops (and
counts) what it cannot write; the oldest segments go first past the folder's bound."""

import datetime as dt
import gzip
import os

import numpy as np
import pandas as pd

from tasks.monitoring.recorder import Recorder, RecordSettings
from tasks.monitoring.records import ANSWERS, EMBEDDING_SIZE, RecordFolder, encode, project, read_records


def record(i: int, model: str = "digits", when: dt.datetime | None = None) -> dict:
    when = when or dt.datetime(2026, 11, 29, 12, 0, i % 60, tzinfo=dt.UTC)
    return {
        "time": when.isoformat(),
        "sha256": f"{i:064x}",
        "model": model,
        "version": 1,
        "precision": "fp32",
        "label": str(i % 10),
        "confidence": 0.9,
        "top": {str(i % 10): 0.9},
        "width": 8,
        "height": 8,
        "mode": "L",
        "orientation": 1,
        "embedding": [0.0] * EMBEDDING_SIZE,
        "image": None,
    }


def test_segments_are_read_in_time_order_skipping_a_damaged_one_and_another_model(tmp_path):
    folder = RecordFolder(str(tmp_path))
    folder.publish("20261129T120000Z-1-1.jsonl.gz", encode([record(i) for i in range(3)]))
    folder.publish("20261129T120100Z-1-2.jsonl.gz", encode([record(3), record(4, model="cats")]))
    folder.publish("20261129T120200Z-1-3.jsonl.gz", encode([record(5)])[:20])  # cut off mid-way
    (tmp_path / ANSWERS / "notes.txt").write_text("not a segment")

    window = read_records(str(tmp_path), model="digits")
    assert list(window.records["sha256"]) == [f"{i:064x}" for i in range(4)]
    assert list(window.damaged) == ["20261129T120200Z-1-3.jsonl.gz"] and window.other_models == 1
    since = read_records(str(tmp_path), since=dt.datetime(2026, 11, 29, 12, 0, 2, tzinfo=dt.UTC))
    assert len(since.records) == 3  # records 2, 3 and the other model's 4
    as_pandas = pd.read_json(tmp_path / ANSWERS / "20261129T120000Z-1-1.jsonl.gz", lines=True)
    assert len(as_pandas) == 3 and list(as_pandas.columns)[:3] == ["time", "sha256", "model"]
    assert gzip.decompress((tmp_path / ANSWERS / "20261129T120000Z-1-1.jsonl.gz").read_bytes()).count(b"\n") == 3


def test_the_projection_is_the_same_in_every_call_and_keeps_distances_roughly():
    embeddings = np.random.default_rng(1).standard_normal((20, 512)).astype(np.float32)
    a, b = project(embeddings), project(embeddings)
    assert a.shape == (20, EMBEDDING_SIZE) and np.array_equal(a, b)
    far, near = np.linalg.norm(embeddings[0] - embeddings[1]), np.linalg.norm(a[0] - a[1])
    assert 0.5 < near / far < 1.5


def test_the_recorder_publishes_whole_segments_and_trims_the_oldest(tmp_path):
    recorder = Recorder(RecordSettings(str(tmp_path), images="all", segment_records=2, max_bytes=1))
    for i in range(5):
        recorder.offer(record(i), image=b"bytes of image %d" % i)
    recorder.close()
    names = sorted(os.listdir(tmp_path / ANSWERS))
    assert len(names) == 1, names  # 3 segments published, the two oldest trimmed past the 1-byte bound
    (last,) = read_records(str(tmp_path)).records.to_dict(orient="records")
    assert last["sha256"] == f"{4:064x}" and (tmp_path / last["image"]).read_bytes() == b"bytes of image 4"


def test_a_full_queue_or_an_unwritable_folder_drops_and_counts_never_raises(tmp_path):
    blocked = tmp_path / "file-not-folder"
    blocked.write_text("")
    dropped = []
    recorder = Recorder(RecordSettings(str(blocked), segment_records=1, queue_size=1), on_drop=dropped.append)
    for i in range(50):
        recorder.offer(record(i))
    recorder.close()
    assert sum(recorder.dropped.values()) == 50 == len(dropped) and recorder.published == 0
    assert set(recorder.dropped) <= {"queue full", "not written"} and recorder.dropped["not written"] > 0


def test_a_share_of_requests_is_recorded_evenly(tmp_path):
    recorder = Recorder(RecordSettings(str(tmp_path), sample=0.25))
    assert sum(recorder.wanted() for _ in range(100)) == 25
    recorder.close()
