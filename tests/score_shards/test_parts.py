"""A sharded scoring's parts: ranges cut at batch multiples that cover every row once, the merge into one table
(bytes joined under one header; an ``error`` column only when an image failed) and the threshold on failed
images. Real CSV parts on disk; no torch, no Prefect."""

import subprocess
import sys

import pandas as pd
import pytest

from tasks.contracts.scores_table import ERROR_COLUMN, read_scores, write_scores
from tasks.errors import FailedImagesError, PipelineInputError
from tasks.score_shards.parts import (
    FailedImage,
    PartSummary,
    check_failures,
    check_sharding,
    merge_parts,
    part_location,
    read_summary,
    shard_ranges,
    write_summary,
)


def test_the_parts_module_loads_neither_torch_nor_prefect_and_the_fan_out_no_torch():
    """The scoring that hands its shards to the pool scores nothing itself: it never pays for torch."""
    code = (
        "import sys, tasks.score_shards.parts; print('torch' in sys.modules, 'prefect' in sys.modules); "
        "import tasks.score_shards.prefect_tasks; print('torch' in sys.modules)"
    )
    assert subprocess.run([sys.executable, "-c", code], capture_output=True, text=True).stdout.split() == [
        "False",
        "False",
        "False",
    ]


@pytest.mark.parametrize(("images", "shards", "batch"), [(1000, 3, 64), (130, 2, 4), (64, 4, 64), (0, 2, 8), (7, 5, 2)])
def test_ranges_cover_every_row_once_and_cut_at_whole_batches(images, shards, batch):
    ranges = shard_ranges(images, shards, batch)
    assert [r.shard for r in ranges] == list(range(len(ranges))) and 1 <= len(ranges) <= shards
    assert ranges[0].start == 0 and ranges[-1].stop == images
    assert all(a.stop == b.start for a, b in zip(ranges, ranges[1:])), "contiguous"
    assert all(r.start % batch == 0 for r in ranges), "each shard forms the one-process scoring's batches"
    assert images == 0 or all(r.stop > r.start for r in ranges), "no empty shard"
    sizes = [r.stop - r.start for r in ranges[:-1]]
    assert not sizes or max(sizes) - min(sizes) <= batch


def test_a_sharding_that_cannot_be_is_one_line():
    for arguments, said in [
        ((0, 0, 10.0), "shards 0 is not allowed"),
        ((2, -1, 10.0), "max_failed_images -1 is not allowed"),
        ((2, 0, 0.0), "shard_timeout_s 0.0 is not allowed"),
    ]:
        with pytest.raises(PipelineInputError, match=said):
            check_sharding(*arguments)


def table(start: int, stop: int) -> pd.DataFrame:
    rows = range(start, stop)
    return pd.DataFrame(
        {
            "image": [f"a, {i}.jpg" for i in rows],  # a comma: quoted in the CSV
            "Scored Labels": ["01" if i % 2 else "02" for i in rows],
            "Scored Probabilities_01": [(i % 7) / 7 for i in rows],
            "Scored Probabilities_02": [1 - (i % 7) / 7 for i in rows],
            "label": ["01"] * len(rows),
        }
    )


def write_parts(run_dir, ranges, failed=()) -> tuple[list[str], list[PartSummary]]:
    parts, summaries = [], []
    for r in ranges:
        part = part_location(str(run_dir), r.shard)
        rows = table(r.start, r.stop)
        mine = [f for f in failed if r.start <= f.row < r.stop]
        for f in mine:
            rows.loc[f.row - r.start, ["Scored Labels", "Scored Probabilities_01", "Scored Probabilities_02"]] = None
        write_scores(rows, part)
        summary = PartSummary(shard=r.shard, start=r.start, stop=r.stop, rows=len(rows), failed=mine)
        write_summary(summary, part)
        parts.append(part)
        summaries.append(read_summary(part))
    return parts, summaries


def test_the_merged_table_is_the_one_table_of_every_row_once(tmp_path):
    ranges = shard_ranges(10, 3, 2)
    parts, summaries = write_parts(tmp_path, ranges)
    merge_parts(parts, summaries, str(tmp_path / "merged.csv"))
    write_scores(table(0, 10), str(tmp_path / "whole.csv"))
    assert (tmp_path / "merged.csv").read_bytes() == (tmp_path / "whole.csv").read_bytes()
    assert ERROR_COLUMN not in read_scores(tmp_path / "merged.csv").columns


def test_a_failed_image_is_a_row_with_its_error_and_no_scores(tmp_path):
    ranges = shard_ranges(10, 2, 2)
    failed = [FailedImage(row=7, image="a, 7.jpg", error="OSError: image file is truncated")]
    parts, summaries = write_parts(tmp_path, ranges, failed)
    assert check_failures(summaries, max_failed_images=1) == failed
    merge_parts(parts, summaries, str(tmp_path / "merged.csv"))
    merged, whole = read_scores(tmp_path / "merged.csv"), table(0, 10)
    assert list(merged.columns) == [*whole.columns, ERROR_COLUMN] and len(merged) == 10
    assert merged.loc[7, ERROR_COLUMN] == "OSError: image file is truncated" and merged[ERROR_COLUMN].notna().sum() == 1
    assert pd.isna(merged.loc[7, "Scored Labels"]) and pd.isna(merged.loc[7, "Scored Probabilities_01"])
    others = merged.drop(index=7).drop(columns=ERROR_COLUMN)
    pd.testing.assert_frame_equal(others, whole.drop(index=7), check_dtype=False)


def test_more_failed_images_than_allowed_is_one_error_naming_them():
    failed = [FailedImage(row=i, image=f"photo-{i}.jpg", error="OSError: truncated") for i in range(12)]
    summaries = [PartSummary(shard=0, start=0, stop=20, rows=20, failed=failed)]
    with pytest.raises(FailedImagesError) as raised:
        check_failures(summaries, max_failed_images=3)
    message = str(raised.value)
    assert "\n" not in message and message.startswith("12 images could not be scored, more than max_failed_images 3")
    assert "photo-0.jpg (OSError: truncated)" in message and "photo-9.jpg" in message and "and 2 more" in message
