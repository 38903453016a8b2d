"""The registry in the Prefect UI, in headless Chromium against the run's shared `prefect server start`: the paused
run's approval form, answered in the browser, and the model card recording the answer. The screenshots land in
build/ui-check/ (the README's docs/images/ pictures are copies of them)."""

from __future__ import annotations

import os
import subprocess
from types import SimpleNamespace

import pytest

from deployments.local import PROJECT_ROOT
from tasks.registry import resolve
from tasks.registry.manage import show_version
from tests.browser import (
    chromium,
    click_text,
    field,
    latest_artifact_id,
    paused_run_id,
    table_overflow,
    wait_for_text,
)
from tests.helpers import pipeline_command, write_class_folders

pytestmark = pytest.mark.integration

NAME = "colours-resnet18"
SHOTS = PROJECT_ROOT / "build" / "ui-check"


@pytest.fixture
def stack(prefect_server):
    """The shared server as the browser and a command line reach it: its UI's address and a client's environment."""
    from prefect.settings import PREFECT_API_URL

    api_url = PREFECT_API_URL.value()
    return SimpleNamespace(
        api_url=api_url, url=api_url.removesuffix("/api"), env={**os.environ, "PREFECT_API_URL": api_url}
    )


def test_the_approval_form_is_answered_in_the_ui_and_the_model_card_shows_it(stack, tmp_path):
    train = write_class_folders(tmp_path / "train", 6)
    val = write_class_folders(tmp_path / "val", 3, seed=1)
    registry = tmp_path / "registry"
    pipeline = subprocess.Popen(
        pipeline_command(
            train,
            val,
            NAME,
            tmp_path,
            *("--epochs", "2", "--batch-size", "4", "--learning-rate", "0.01", "--promote-to", "production"),
            *("--approval", "--approval-timeout-s", "300"),
        ),
        cwd=PROJECT_ROOT,
        env=stack.env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    SHOTS.mkdir(parents=True, exist_ok=True)
    driver = chromium(tmp_path / "chromium")
    try:
        # Other tests pause runs on the shared server too: this one is the pipeline's run with this test's registry.
        run_id = paused_run_id(stack, pipeline, flow="train-pipeline", registry=f"{tmp_path}/registry")
        driver.get(f"{stack.url}/runs/flow-run/{run_id}")
        wait_for_text(driver, ["Paused", "Resume"])
        click_text(driver, "Resume")
        form = wait_for_text(
            driver,
            [
                f"Promote {NAME} version 1 to production?",
                "challenger: version 1",
                "Decision",
                "Reviewer",  # required: the record names who decided
                "Comment (Optional)",
            ],
        )
        assert "accuracy (decides)" in form and "Reviewer (Optional)" not in form
        field(driver, "Decision", "div[contains(@class, 'p-select')]").click()
        click_text(driver, "approve")
        field(driver, "Reviewer", "textarea").send_keys("ada")
        field(driver, "Comment", "textarea").send_keys("looks right")
        driver.save_screenshot(str(SHOTS / "approval-form.png"))
        click_text(driver, "Submit")

        output, _ = pipeline.communicate(timeout=300)
        assert pipeline.returncode == 0, output
        assert "promoted to 'production'" in output and "approved by ada: looks right" in output
        assert resolve(registry, f"{NAME}@production").version == 1
        assert show_version(registry, f"{NAME}/1").approval.reviewer == "ada"

        driver.get(f"{stack.url}/artifacts/artifact/{latest_artifact_id(stack, f'model-card-{NAME}', run_id)}")
        driver.set_window_size(1440, 900)
        wait_for_text(driver, [f"Model card: {NAME}", "approved by ada", "“looks right”", "production"])
        driver.save_screenshot(str(SHOTS / "model-card.png"))
        # The card's table fits a 1440 px window: the box around it (which scrolls what does not fit) needs no scroll.
        assert table_overflow(driver) <= 0, f"the model card's table is {table_overflow(driver)} px too wide at 1440 px"
    finally:
        driver.quit()
        if pipeline.poll() is None:
            pipeline.kill()
    assert all((SHOTS / name).stat().st_size > 10_000 for name in ("approval-form.png", "model-card.png"))
