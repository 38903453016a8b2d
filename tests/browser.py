"""Headless Chromium (Debian's chromium and chromium-driver) driven by Selenium, with nothing downloaded."""

from __future__ import annotations

import os
import shutil
import subprocess
from concurrent.futures import Future
from pathlib import Path

from tests.helpers import wait_for

CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
CHROMEDRIVER = shutil.which("chromedriver") or "/usr/bin/chromedriver"
# The flags keep Chromium from reaching out to the network this machine does not have.
CHROMIUM_FLAGS = (
    "--headless=new",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--window-size=1400,1000",
)
# Without a GPU, Chromium draws WebGL (the run page's graph) with SwiftShader on the CPU, and redraws it while the
# page is open: one run page took 54 CPU-s in 30 s on the 2-core machine, 2 CPU-s with this flag. The tests read
# text, never the graph; the README's pictures (docs/screenshots.py) keep it.
NO_WEBGL = "--disable-software-rasterizer"


def chromium(profile: Path | None = None, *, webgl: bool = False):
    """A Selenium driver for Debian's Chromium with its profile in ``profile`` (a test's own folder, removed with
    it: a profile is 10-15 MB; None: a temporary one of chromedriver's), WebGL drawn only when asked (``NO_WEBGL``);
    a clear error when Chromium is not installed."""
    if not (Path(CHROMIUM).exists() and Path(CHROMEDRIVER).exists()):
        raise RuntimeError(
            f"the browser check needs Debian's chromium and chromium-driver ({CHROMIUM}, {CHROMEDRIVER}): "
            "`make test` installs them with apt-get, or run `apt-get install chromium chromium-driver`"
        )
    os.environ["SE_OFFLINE"] = "true"  # Selenium Manager must not try to download a browser or driver
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    flags = [*CHROMIUM_FLAGS, *([] if webgl else [NO_WEBGL])]
    for flag in [*flags, *([f"--user-data-dir={profile}"] if profile else [])]:
        options.add_argument(flag)
    return webdriver.Chrome(service=Service(CHROMEDRIVER), options=options)


def wait_for_text(driver, texts, timeout: float = 30) -> str:
    """The page's visible text once it contains every one of ``texts`` (an SPA renders after load)."""
    from selenium.webdriver.common.by import By

    shown = [""]

    def showing() -> str | None:
        shown[0] = driver.find_element(By.TAG_NAME, "body").text
        return shown[0] if all(text in shown[0] for text in texts) else None

    def what() -> str:
        missing = [text for text in texts if text not in shown[0]]
        return f"{driver.current_url} to show {missing}; it showed:\n{shown[0][:2000]}"

    return wait_for(showing, timeout, interval=0.5, what=what)


def click_text(driver, text: str, timeout: float = 30) -> None:
    """Click the innermost element whose whole visible text is ``text`` (tabs and links wrap it in spans)."""
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support import expected_conditions
    from selenium.webdriver.support.ui import WebDriverWait

    locator = (By.XPATH, f"(//*[normalize-space(.)='{text}'])[last()]")
    WebDriverWait(driver, timeout).until(expected_conditions.element_to_be_clickable(locator)).click()


def paused_run_id(
    stack,
    pipeline: subprocess.Popen | Future,
    timeout: float = 300,
    flow: str | None = None,
    registry: str | None = None,
) -> str:
    """The id of the first Paused flow run on ``stack``'s server (with its basic-auth string ``stack.auth`` when it
    has one); on a server that others use, the run of ``flow`` whose ``registry`` parameter is the one given.
    ``pipeline`` is what is expected to pause: a process, or a flow (or a process's wait) running in a thread."""
    from prefect.client.orchestration import SyncPrefectClient
    from prefect.client.schemas.filters import (
        FlowFilter,
        FlowFilterName,
        FlowRunFilter,
        FlowRunFilterState,
        FlowRunFilterStateType,
    )
    from prefect.client.schemas.objects import StateType

    waiting = FlowRunFilter(state=FlowRunFilterState(type=FlowRunFilterStateType(any_=[StateType.PAUSED])))
    named = FlowFilter(name=FlowFilterName(any_=[flow])) if flow else None
    in_thread = isinstance(pipeline, Future)

    def what_the_pipeline_said() -> str:
        ended = pipeline.done() if in_thread else pipeline.poll() is not None
        if not in_thread:
            return pipeline.communicate(timeout=60)[0][-3000:]
        if not ended:
            return "still running"
        if pipeline.exception():
            return repr(pipeline.exception())
        return f"it ended, returning {pipeline.result()!r}"

    def paused(client):
        runs = [
            r
            for r in client.read_flow_runs(flow_filter=named, flow_run_filter=waiting)
            if registry is None or r.parameters.get("registry") == registry
        ]
        if not runs and (pipeline.done() if in_thread else pipeline.poll() is not None):
            raise AssertionError(f"the pipeline never paused:\n{what_the_pipeline_said()}")
        return runs

    with SyncPrefectClient(stack.api_url, auth_string=getattr(stack, "auth", None)) as client:
        runs = wait_for(
            lambda: paused(client),
            timeout,
            interval=1,
            what=lambda: f"the pipeline to pause:\n{what_the_pipeline_said()}",
        )
    return str(runs[0].id)


def latest_artifact_id(stack, key: str, flow_run_id: str | None = None) -> str:
    """The latest artifact of ``key`` on ``stack``'s server (of one flow run when given)."""
    from prefect.client.orchestration import SyncPrefectClient
    from prefect.client.schemas.filters import ArtifactFilter, ArtifactFilterFlowRunId, ArtifactFilterKey

    of_run = ArtifactFilterFlowRunId(any_=[flow_run_id]) if flow_run_id else None
    with SyncPrefectClient(stack.api_url, auth_string=getattr(stack, "auth", None)) as client:
        artifacts = client.read_artifacts(
            artifact_filter=ArtifactFilter(key=ArtifactFilterKey(any_=[key]), flow_run_id=of_run)
        )
    return str(max(artifacts, key=lambda a: a.created).id)


def field(driver, label: str, element: str):
    """The input of the form field labelled ``label`` (the UI adds " (Optional)" to optional ones)."""
    from selenium.webdriver.common.by import By

    return driver.find_element(
        By.XPATH,
        f"//span[normalize-space(.)='{label}' or normalize-space(.)='{label} (Optional)']"
        f"/ancestor::div[contains(concat(' ', @class, ' '), ' schema-form-property ')][1]//{element}",
    )


def table_overflow(driver) -> int:
    """How many pixels the page's first table is wider than the box it is shown in (0 or less: it fits)."""
    return driver.execute_script(
        "const t = document.querySelector('table'); const box = t.parentElement;"
        "return Math.max(t.scrollWidth, box.scrollWidth) - box.clientWidth"
    )
