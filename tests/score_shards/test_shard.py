"""One shard on its host, with the shared trained model and real images: shards merged are the one-process table
byte for byte; a damaged image, locally or on S3, is a row without scores while the rest of its batch is
scored as before."""

import shutil
from pathlib import Path

import pandas as pd
import pytest

from tasks.contracts.image_directory import INDEX_NAME, MANIFEST_NAME, ImageDirectory
from tasks.contracts.model_directory import ModelDirectory
from tasks.contracts.scores_table import ERROR_COLUMN, read_scores, write_score_chunks
from tasks.convert.conversion import convert_to_image_directory
from tasks.errors import UnreadableImageError
from tasks.evaluation.score import score_chunks, score_images
from tasks.score_shards.parts import check_failures, merge_parts, part_location, shard_ranges
from tasks.score_shards.shard import score_part
from tasks.storage.s3 import s3_client
from tasks.storage.work_dir_on_s3 import CACHE_VARIABLE
from tasks.work_dir.images import publish
from tests.helpers import write_class_folders


def one_process_table(model, images, location, batch_size=4):
    write_score_chunks(score_chunks(ModelDirectory(model), ImageDirectory(images), batch_size=batch_size), location)


def test_shards_merged_are_the_one_process_table_byte_for_byte(trained_model, colour_image_dirs, tmp_path):
    images = str(colour_image_dirs[1])
    ranges = shard_ranges(len(ImageDirectory(images)), 3, 4)
    assert len(ranges) == 3
    summaries = [
        score_part(str(trained_model), images, r, part_location(str(tmp_path), r.shard), batch_size=4) for r in ranges
    ]
    assert [s.rows for s in summaries] == [r.stop - r.start for r in ranges] and not any(s.failed for s in summaries)
    assert all(s.first_image_at and s.first_image_at >= s.started_at for s in summaries)
    parts = [part_location(str(tmp_path), r.shard) for r in ranges]
    merge_parts(parts, summaries, str(tmp_path / "merged.csv"))
    one_process_table(trained_model, images, str(tmp_path / "whole.csv"))
    assert (tmp_path / "merged.csv").read_bytes() == (tmp_path / "whole.csv").read_bytes()


def test_a_damaged_image_is_a_row_without_scores_and_its_batch_is_scored(trained_model, colour_image_dirs, tmp_path):
    images = ImageDirectory(shutil.copytree(colour_image_dirs[1], tmp_path / "images"))
    damaged = 5  # in the middle of the second batch of 4
    (images.root / images.index.path[damaged]).write_bytes(b"\xff\xd8\xff\xe0 not a JPEG any more")
    ranges = shard_ranges(len(images), 2, 4)
    summaries = [
        score_part(str(trained_model), str(images.root), r, part_location(str(tmp_path), r.shard), batch_size=4)
        for r in ranges
    ]
    failed = check_failures(summaries, max_failed_images=1)
    assert [(f.row, f.image) for f in failed] == [
        (damaged, images.index.source_path[damaged] or images.index.path[damaged])
    ]
    assert "cannot identify image file" in failed[0].error or "Error" in failed[0].error, failed[0].error
    merge_parts([part_location(str(tmp_path), r.shard) for r in ranges], summaries, str(tmp_path / "merged.csv"))
    merged = read_scores(tmp_path / "merged.csv")
    one_process_table(trained_model, colour_image_dirs[1], str(tmp_path / "whole.csv"))
    whole = read_scores(tmp_path / "whole.csv")
    assert merged[ERROR_COLUMN].notna().tolist() == [i == damaged for i in range(len(whole))]
    assert (
        merged.loc[damaged, ["Scored Labels", "Scored Probabilities_" + ModelDirectory(trained_model).classes[0]]]
        .isna()
        .all()
    )
    pd.testing.assert_frame_equal(merged.drop(index=damaged, columns=ERROR_COLUMN), whole.drop(index=damaged))
    with pytest.raises(UnreadableImageError, match="damaged or truncated"):  # one process tolerates nothing
        score_images(ModelDirectory(trained_model), images)


def test_a_shard_fetches_only_its_range_from_s3_and_names_an_image_damaged_there(
    trained_model, colour_image_dirs, s3_bucket, tmp_path, monkeypatch
):
    monkeypatch.setenv(CACHE_VARIABLE, str(tmp_path / "cache"))
    images = ImageDirectory(colour_image_dirs[1])
    location = publish(images.root, f"s3://{s3_bucket}/images")
    bucket, _, prefix = location.removeprefix("s3://").partition("/")
    s3_client().put_object(Bucket=bucket, Key=f"{prefix}/{images.index.path[6]}", Body=b"damaged in the bucket")
    model = publish(trained_model, f"s3://{s3_bucket}/model")
    ranges = shard_ranges(len(images), 2, 4)
    summary = score_part(model, location, ranges[1], part_location(f"s3://{s3_bucket}/run", 1), batch_size=4)
    assert [(f.row, f.error) for f in summary.failed] == [
        (6, "its bytes differ from the sha256 recorded when it was converted (damaged since)")
    ]
    (folder,) = (tmp_path / "cache" / "images").glob("*-ranges")
    fetched = {p.relative_to(folder).as_posix() for p in folder.rglob("*") if p.is_file()}
    wanted = {images.index.path[i] for i in range(ranges[1].start, ranges[1].stop)}
    assert fetched == wanted | {MANIFEST_NAME, INDEX_NAME}, "its range only"


def test_on_the_device_path_a_damaged_jpeg_costs_its_row_not_its_batch(trained_model, tmp_path):
    """decode_on="device" (nvJPEG on CUDA; torchvision's decoder here) decodes a batch in one call, which a damaged
    JPEG fails whole: the batch is decoded again image by image and only that image's row has no scores."""
    source = write_class_folders(tmp_path / "photos", 4, ext=".jpg")
    images = convert_to_image_directory(source, tmp_path / "images")
    ranges = shard_ranges(len(images), 2, 4)

    def scored(folder: Path, name: str):
        parts = [part_location(str(tmp_path / name), r.shard) for r in ranges]
        options = {"batch_size": 4, "decode_on": "device"}
        summaries = [score_part(str(trained_model), str(folder), r, p, **options) for r, p in zip(ranges, parts)]
        merge_parts(parts, summaries, str(tmp_path / f"{name}.csv"))
        return summaries, read_scores(tmp_path / f"{name}.csv")

    _, whole = scored(images.root, "whole")
    damaged = ImageDirectory(shutil.copytree(images.root, tmp_path / "damaged"))
    row = 6
    path = damaged.root / damaged.index.path[row]
    path.write_bytes(path.read_bytes()[:20] + b"not the rest of a JPEG" * 8)
    summaries, merged = scored(damaged.root, "damaged")
    assert [f.row for s in summaries for f in s.failed] == [row]
    assert merged[ERROR_COLUMN].notna().tolist() == [i == row for i in range(len(whole))]
    pd.testing.assert_frame_equal(merged.drop(index=row, columns=ERROR_COLUMN), whole.drop(index=row))
