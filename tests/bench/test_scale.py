"""bench.scale's arithmetic: per-image times, the memory slope and its extrapolation, the figures against issue
23's targets. (Running the stages takes minutes at any size worth measuring: ``python -m bench.scale``.)"""

import pytest

from bench.scale import IMAGENET, STAGES, report, slope_kb


def stage(seconds: float, peak: float, held: float | None = None) -> dict:
    return {"seconds": seconds, "peak_mb": peak, "held_mb": held, "rss_mb": 60 + peak}  # 60 MB of imports


def results_growing_by(kb_per_image: float) -> dict[int, dict[str, dict]]:
    """Two sizes where every stage takes 1 ms per image and its memory grows by ``kb_per_image``."""
    out = {}
    for n in (1000, 3000):
        mb = 50 + n * kb_per_image / 1024
        out[n] = {s: stage(n / 1000, mb, mb if s in ("index", "imagefolder") else None) for s in STAGES}
        out[n]["plain"] = stage(n / 2000, 10)  # twice as fast as the others
        out[n]["imagefolder"] = stage(n / 1e5, 40, 40)
    return out


def test_the_slope_is_per_image_and_extrapolated_from_the_smallest_size():
    per_image, at_imagenet = slope_kb(results_growing_by(2.0), "convert", "peak_mb")
    assert per_image == pytest.approx(2.0)
    assert at_imagenet == pytest.approx(50 + IMAGENET * 2.0 / 1024)


def test_figures_hold_the_targets_of_issue_23():
    text, figures = report(results_growing_by(20.0))
    assert "1,000 us/img" in text and "20.00 KB/img" in text
    by_name = {f.name.split(",")[0]: f for f in figures}
    conversion = by_name["scale: conversion time per image"]
    assert conversion.ratio == pytest.approx(2.0) and conversion.met  # 1 ms against the loop's 0.5 ms: at the limit
    growth = by_name["scale: conversion process's peak RSS"]  # the process's own peak, its imports included
    assert growth.ours == pytest.approx((110 + 3000 * 20 / 1024) / (110 + 1000 * 20 / 1024)) and not growth.met
    assert "(process 130 MB)" in text
    index = by_name["scale: training index memory per rank"]
    assert index.ratio == pytest.approx((50 + 3000 * 20 / 1024) / 40) and not index.met
    assert by_name["scale: index load per rank"].ours == pytest.approx(3.0)


def test_flat_memory_meets_the_growth_target():
    _, figures = report(results_growing_by(0.0))
    assert next(f for f in figures if "peak RSS" in f.name).met
