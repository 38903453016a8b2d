"""The deployment file points at the real flow and its parameters pass the flow's own validation."""

from pathlib import Path

import yaml
from prefect.flows import load_flow_from_entrypoint

ROOT = Path(__file__).resolve().parents[1]


def test_every_deployment_names_a_real_flow_with_valid_parameters(monkeypatch):
    monkeypatch.chdir(ROOT)
    config = yaml.safe_load((ROOT / "deployments" / "prefect.yaml").read_text())
    assert config["deployments"]
    for deployment in config["deployments"]:
        flow = load_flow_from_entrypoint(deployment["entrypoint"])
        validated = flow.validate_parameters(deployment.get("parameters", {}))
        assert validated["training"].epochs == deployment["parameters"]["training"]["epochs"]
        for schedule in deployment.get("schedules", []):
            assert schedule["timezone"] and schedule["cron"]
