"""The README's pictures, from the real digits model: a Prefect server on loopback, the pipeline `make run` runs
(ResNet-18, 5 epochs, the bundled digits) with a promotion that waits for approval, the approval form answered in
headless Chromium, then the evaluation and the model card, each at a 1440 x 900 window.

    make screenshots                 # writes docs/images/*.png (about 5 minutes on 2 CPU cores)

The same browser steps are asserted by tests/deployments/test_deployments.py's finished run on a small model; this is
the picture of the real one. Nothing outside a temporary folder and the output folder is written.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
from pathlib import Path

from deployments.local import PROJECT_ROOT, PrefectStack
from tests import browser

NAME = "digits-resnet18"
WINDOW = (1440, 900)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--output", type=Path, default=PROJECT_ROOT / "docs" / "images", help="where the pictures go")
    args = parser.parse_args(argv)
    args.output.mkdir(parents=True, exist_ok=True)
    with (
        tempfile.TemporaryDirectory(prefix="screenshots-") as scratch,
        PrefectStack(home=Path(scratch) / "home") as stack,
    ):
        command = [
            sys.executable,
            "-m",
            "flows.pipeline",
            "--processes-per-node",
            "2",  # as make run (RUN_ARGS): the same figures as the README's
            "--registry",
            f"{scratch}/registry",
            "--work-dir",
            f"{scratch}/runs",
            "--promote-to",
            "production",
            "--approval",
            "--approval-timeout-s",
            "1800",
        ]
        print("training the digits model (as make run does) on a server at", stack.url, flush=True)
        pipeline = subprocess.Popen(
            command, cwd=PROJECT_ROOT, env=stack.env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
        )
        driver = browser.chromium(webgl=True)  # the run graph in the pictures
        driver.set_window_size(*WINDOW)
        try:
            run_id = browser.paused_run_id(stack, pipeline, timeout=1800)
            driver.get(f"{stack.url}/runs/flow-run/{run_id}")
            browser.wait_for_text(driver, ["Paused", "Resume"])
            browser.click_text(driver, "Resume")
            browser.wait_for_text(driver, [f"Promote {NAME} version 1 to production?", "Decision", "Reviewer"])
            browser.field(driver, "Decision", "div[contains(@class, 'p-select')]").click()
            browser.click_text(driver, "approve")
            browser.field(driver, "Reviewer", "textarea").send_keys("ada")
            browser.field(driver, "Comment", "textarea").send_keys("confusion matrix looks right")
            driver.save_screenshot(str(args.output / "approval-form.png"))
            browser.click_text(driver, "Submit")
            output, _ = pipeline.communicate(timeout=900)
            if pipeline.returncode != 0:
                raise SystemExit(f"the pipeline failed:\n{output[-3000:]}")
            print(output.strip().splitlines()[-4:][0] if output.strip() else "", flush=True)

            driver.get(f"{stack.url}/artifacts/artifact/{browser.latest_artifact_id(stack, 'evaluation')}")
            browser.wait_for_text(driver, ["accuracy", "F1 (macro)"])
            driver.save_screenshot(str(args.output / "evaluation.png"))
            driver.execute_script("document.querySelector('img[alt=\"confusion matrix\"]').scrollIntoView()")
            driver.save_screenshot(str(args.output / "confusion-matrix.png"))

            driver.get(f"{stack.url}/artifacts/artifact/{browser.latest_artifact_id(stack, f'model-card-{NAME}')}")
            browser.wait_for_text(driver, [f"Model card: {NAME}", "approved by ada", "production"])
            driver.save_screenshot(str(args.output / "model-card.png"))
            if (overflow := browser.table_overflow(driver)) > 0:
                raise SystemExit(f"the model card's table is {overflow} px too wide for a {WINDOW[0]} px window")
        finally:
            driver.quit()
            if pipeline.poll() is None:
                pipeline.kill()
    print("pictures written to", args.output)


if __name__ == "__main__":
    main()
