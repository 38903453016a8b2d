"""The model card on a real Prefect server: one artifact per model name whose latest version lists every
registered version, refreshed by each registration and, through the update-model-card flow (flows/model_card.py),
by an alias moved from the command line."""

import asyncio

import pytest
from prefect import flow
from prefect.settings import PREFECT_API_URL, PREFECT_UI_URL

from tasks.contracts.image_directory import ImageDirectory
from tasks.contracts.model_directory import ModelDirectory
from tasks.evaluation.evaluate import evaluate_scores
from tasks.evaluation.score import score_images
from tasks.registry import PromotionPolicy, lineage
from tasks.registry.card import model_card_key
from tests.helpers import card_versions, register_colours, registry_cli

pytestmark = pytest.mark.integration

NAME = "colours-resnet18"


def test_the_model_card_follows_registrations_and_alias_moves(
    prefect_server, trained_model, colour_image_dirs, tmp_path
):
    train, val = colour_image_dirs
    evaluation = evaluate_scores(score_images(ModelDirectory(trained_model), ImageDirectory(val)))
    registry = str(tmp_path / "registry")

    @flow(name="register-colours")
    def register_once(promote_to: str | None):
        policy = PromotionPolicy(promote_to=promote_to)
        return register_colours(registry, NAME, trained_model, colour_image_dirs, evaluation.figures(), policy)

    first, second = register_once("production"), register_once(None)
    moved = registry_cli(
        registry, "alias", "set", NAME, "production", "2", env={"PREFECT_API_URL": PREFECT_API_URL.value()}
    )
    assert moved.returncode == 0 and f"model card updated: artifact {model_card_key(NAME)}" in moved.stdout, (
        moved.stderr
    )
    assert moved.stderr == "", "no deprecation warning, no Prefect run lines on the console"

    cards = asyncio.run(card_versions("model-card-colours-resnet18"))
    assert len(cards) == 3, "one card version per registration and per alias move"
    assert [c.flow_run_id and str(c.flow_run_id) for c in cards] == [
        first.registration.flow_run_id,
        second.registration.flow_run_id,
        cards[-1].flow_run_id and str(cards[-1].flow_run_id),
    ]
    assert cards[-1].flow_run_id is not None, "made in a flow run (update-model-card), as Prefect supports"
    assert cards[-1].description == f"{NAME}: 2 versions; aliases: production → 2"
    rows = [line for line in cards[-1].data.splitlines() if line.startswith("| 1 ") or line.startswith("| 2 ")]
    assert [row.split(" | ")[0] for row in rows] == ["| 2", "| 1"], "newest first"
    ui = PREFECT_UI_URL.value().rstrip("/")
    hashes = (lineage(train).content_hash[:12], lineage(val).content_hash[:12])
    for row, registered, alias in zip(rows, (second, first), ("`production`", "")):
        cells = row.split(" | ")
        run_id = registered.registration.flow_run_id
        assert f"{evaluation.accuracy:.4g}" in cells and alias in cells and "team" not in row
        assert row.endswith(f"[{run_id[:8]}]({ui}/runs/flow-run/{run_id}) |")
    # The rest of each version, below the table (newest first): the table stays narrow.
    details = cards[-1].data.split("#### Details")[1]
    assert details.index("**Version 2**") < details.index("**Version 1**")
    assert details.count(f"- datasets (content hash): train `{hashes[0]}` (24 images); validation `{hashes[1]}`") == 2
    assert "`production` → 1" in cards[0].data and "production → 2" not in cards[1].description
