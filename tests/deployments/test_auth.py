"""A server on the network lets no one in: `make server HOST=0.0.0.0` turns basic auth on, `make deploy` and
`make worker` find the secret in its 0600 file, no secret shows in `ps`, a run's logs, parameters, artifacts
or registration, and the UI asks for it."""

import asyncio
import json
import os
import stat
import subprocess
import sys
import time
import urllib.error
import urllib.request
import uuid
from pathlib import Path

import pytest

from deployments.auth import (
    AUTH_FILE,
    CLIENT_AUTH,
    DATABASE_FILE,
    SERVER_AUTH,
    SecretFileError,
    client_environment,
    read_secret,
    server_environment,
)
from deployments.local import PROJECT_ROOT, PrefectStack
from tasks.storage.s3 import s3_client

MAKE = ["make", "--no-print-directory", "-o", f"{sys.prefix}/.installed", f"VENV={sys.prefix}"]


@pytest.fixture
def config(tmp_path, monkeypatch) -> Path:
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path))
    monkeypatch.delenv("IMAGE_CLASSIFIER_CONFIG", raising=False)
    return tmp_path / "image-classifier"


def test_a_server_on_loopback_stays_open_and_one_on_the_network_creates_its_secret_once(config):
    assert server_environment("127.0.0.1", {}, insecure=False) == ({}, None)
    assert not config.exists()
    env, told = server_environment("0.0.0.0", {}, insecure=False)
    path = config / AUTH_FILE
    assert f"created {path} (mode 0600)" in told
    assert stat.S_IMODE(path.stat().st_mode) == 0o600 and env[SERVER_AUTH] == path.read_text().strip()
    user, password = env[SERVER_AUTH].split(":")
    assert user == "prefect" and len(password) >= 32
    again, told = server_environment("10.0.0.5", {}, insecure=False)
    assert again[SERVER_AUTH] == env[SERVER_AUTH] and str(path) in told and "created" not in told
    behind_a_proxy = {"PREFECT_UI_API_URL": "https://prefect.example.org/api"}
    assert server_environment("127.0.0.1", behind_a_proxy, insecure=False)[0][SERVER_AUTH] == env[SERVER_AUTH]
    # A client of a remote server takes it from the file; one of the temporary local server needs none.
    assert client_environment({"PREFECT_API_URL": "http://gpu-server:4200/api"})[CLIENT_AUTH] == env[SERVER_AUTH]
    assert CLIENT_AUTH not in client_environment({})


def test_the_opt_out_names_the_risk_and_the_environment_wins_over_the_file(config):
    env, told = server_environment("0.0.0.0", {}, insecure=True)
    assert SERVER_AUTH not in env and not config.exists()
    assert "INSECURE=1" in told and "open" in told and "run any shell command" in told
    env, told = server_environment("0.0.0.0", {SERVER_AUTH: "admin:given"}, insecure=False)
    assert env[SERVER_AUTH] == "admin:given" and told is None and not config.exists()


def test_a_secret_file_others_may_read_is_refused_in_one_line(config):
    config.mkdir()
    (config / DATABASE_FILE).write_text("postgresql+asyncpg://prefect:pw@db/prefect\n")
    (config / DATABASE_FILE).chmod(0o644)
    with pytest.raises(SecretFileError, match=r"may be read by others \(mode 0644\): run `chmod 600 "):
        read_secret(config / DATABASE_FILE)
    (config / DATABASE_FILE).chmod(0o600)
    env, _ = server_environment("127.0.0.1", {}, insecure=False)
    assert env["PREFECT_SERVER_DATABASE_CONNECTION_URL"] == "postgresql+asyncpg://prefect:pw@db/prefect"

    (config / AUTH_FILE).write_text("prefect:x\n")
    (config / AUTH_FILE).chmod(0o640)
    command = [sys.executable, "-m", "deployments.auth", "client", "--", "true"]
    environment = {**os.environ, "PREFECT_API_URL": "http://gpu-server:4200/api"}
    refused = subprocess.run(command, cwd=PROJECT_ROOT, env=environment, capture_output=True, text=True)
    assert refused.returncode != 0 and refused.stderr.count("\n") == 1 and "chmod 600" in refused.stderr


def test_make_refuses_a_secret_given_on_its_command_line():
    for variable in ("PREFECT_API_AUTH_STRING", "PREFECT_SERVER_DATABASE_CONNECTION_URL", "AWS_SECRET_ACCESS_KEY"):
        result = subprocess.run(
            [*MAKE, "-n", "worker", f"{variable}=x"], cwd=PROJECT_ROOT, capture_output=True, text=True
        )
        assert result.returncode != 0 and f"{variable} given to make shows in `ps`" in result.stderr


@pytest.fixture(scope="module")
def secured(prefect_home, s3_endpoint):
    """`make server HOST=0.0.0.0` with no secret anywhere (the file is created), `make deploy` and a `make
    worker` that find it in that file, and the worker's environment holding planted S3 credentials (for the
    loopback S3 endpoint, which takes any) and database password."""
    home = prefect_home("secured-home")
    settings = {"XDG_CONFIG_HOME": str(home / "config")}
    with PrefectStack(home=home, settings=settings, make_server=True, server_variables={"HOST": "0.0.0.0"}) as stack:
        planted = {
            "AWS_ENDPOINT_URL": s3_endpoint,
            "AWS_DEFAULT_REGION": "us-east-1",
            "AWS_ACCESS_KEY_ID": "planted",
            "AWS_SECRET_ACCESS_KEY": f"planted-s3-{uuid.uuid4().hex}",
            "PREFECT_SERVER_DATABASE_CONNECTION_URL": f"postgresql+asyncpg://prefect:planted-db-{uuid.uuid4().hex}@db/p",
        }
        deploy = stack.make("deploy", "deploy")
        assert deploy.wait(timeout=300) == 0, (stack.logs / "deploy.log").read_text()
        stack.make("gpu-secured", "worker", env={**stack.env, **planted}, POOL="gpu", WORKER_NAME="gpu-secured")
        stack.auth_file = home / "config" / "image-classifier" / AUTH_FILE
        stack.planted = planted
        yield stack


def post(url: str, body: dict, auth: str | None = None) -> int:
    import base64

    request = urllib.request.Request(url, data=json.dumps(body).encode(), method="POST")
    request.add_header("Content-Type", "application/json")
    if auth:
        request.add_header("Authorization", "Basic " + base64.b64encode(auth.encode()).decode())
    try:
        with urllib.request.urlopen(request, timeout=30) as answer:
            return answer.status
    except urllib.error.HTTPError as error:
        return error.code


@pytest.mark.integration
def test_a_server_on_every_address_turns_auth_on_and_refuses_the_shell_step_attack(secured):
    path = secured.auth_file
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert f"Prefect API basic auth: created {path}" in (secured.logs / "server.log").read_text()
    auth = path.read_text().strip()
    assert post(f"{secured.api_url}/flows/", {"name": "anonymous"}) == 401
    attack = {
        "name": "attack",
        "flow_id": str(uuid.uuid4()),
        "work_pool_name": "gpu",
        "pull_steps": [{"prefect.deployments.steps.run_shell_script": {"script": "touch /tmp/owned"}}],
    }
    assert post(f"{secured.api_url}/deployments/", attack) == 401
    assert post(f"{secured.api_url}/flows/", {"name": "with-the-secret"}, auth=auth) == 201

    # A worker host without the file is told so in one line, before anything starts.
    elsewhere = {**secured.env, "XDG_CONFIG_HOME": str(path.parent.parent / "elsewhere")}
    command = [sys.executable, "-m", "deployments.auth", "client", "--", "true"]
    told = subprocess.run(command, cwd=PROJECT_ROOT, env=elsewhere, capture_output=True, text=True)
    assert told.returncode != 0 and told.stderr.count("\n") == 1 and "asks for basic auth" in told.stderr

    # A command run without the credentials (not through `deployments.auth client`) is told so too.
    without = {key: value for key, value in secured.env.items() if key != CLIENT_AUTH}
    command = [sys.executable, "-m", "deployments.deploy"]
    told = subprocess.run(command, cwd=PROJECT_ROOT, env=without, capture_output=True, text=True, timeout=120)
    assert told.returncode == 2 and told.stderr.count("\n") == 1, told.stderr
    assert f"the Prefect server at {secured.api_url} asks for credentials (HTTP 401)" in told.stderr


def processes_showing(texts: list[str]) -> list[str]:
    lines = subprocess.run(["ps", "-ww", "-eo", "args"], capture_output=True, text=True, check=True).stdout.splitlines()
    return [line for line in lines if any(text in line for text in texts)]


async def everything_the_run_left(api_url: str, auth: str, run_id: str) -> tuple[object, str]:
    """The run, and its logs, parameters, artifacts and its task runs' parameters as one text."""
    from prefect.client.orchestration import PrefectClient
    from prefect.client.schemas.filters import ArtifactFilter, ArtifactFilterFlowRunId, LogFilter, LogFilterFlowRunId

    async with PrefectClient(api_url, auth_string=auth) as client:
        run = await client.read_flow_run(run_id)
        logs = await client.read_logs(LogFilter(flow_run_id=LogFilterFlowRunId(any_=[run.id])))
        artifacts = await client.read_artifacts(
            artifact_filter=ArtifactFilter(flow_run_id=ArtifactFilterFlowRunId(any_=[run.id]))
        )
    texts = [json.dumps(run.parameters), *(log.message for log in logs)]
    texts += [f"{a.key} {a.description} {json.dumps(a.data, default=str)}" for a in artifacts]
    assert len(logs) > 10 and {"training-metrics", "registered-model"} <= {a.key for a in artifacts}
    return run, "\n".join(texts)


@pytest.mark.integration
def test_a_deployment_run_through_the_secured_server_leaves_no_secret_anywhere(
    secured, colour_image_dirs, s3_bucket, tmp_path
):
    """make deploy + make worker with the secret from the file run a training end to end; the auth string and
    the planted S3 key and database password appear in no process's arguments, and nowhere in the run's Prefect
    logs, parameters, artifacts, registration record, run folder or the stack's own logs."""
    auth = secured.auth_file.read_text().strip()
    database_password = secured.planted["PREFECT_SERVER_DATABASE_CONNECTION_URL"].split(":")[-1].split("@")[0]
    secrets = [auth.split(":")[1], secured.planted["AWS_SECRET_ACCESS_KEY"], database_password]
    train, val = colour_image_dirs
    parameters = {
        "train_data": str(train),
        "validation_data": str(val),
        "model_name": "secured",
        "model": {"pretrained": False},
        "training": {"epochs": 1, "batch_size": 4, "processes_per_node": 1},
        "registry": f"s3://{s3_bucket}/registry",  # registered by the worker with the planted S3 credentials
        "work_dir": str(tmp_path / "runs"),
    }
    started = secured.cli(
        "deployment", "run", "train-pipeline/retrain-digits", "--params", json.dumps(parameters),
        env={CLIENT_AUTH: auth, "COLUMNS": "1000"},
    ).stdout  # fmt: skip
    run_id = next(line.split()[-1] for line in started.splitlines() if "UUID:" in line)

    from prefect.client.orchestration import get_client
    from prefect.settings import PREFECT_API_AUTH_STRING, PREFECT_API_URL, temporary_settings

    shown, looked_at_the_worker = [], False
    deadline = time.monotonic() + 400
    settings = {PREFECT_API_URL: secured.api_url, PREFECT_API_AUTH_STRING: auth}
    with temporary_settings(settings), get_client(sync_client=True) as client:
        # The server, the worker, the flow run and torchrun's processes, looked at every second while they run.
        while not (state := client.read_flow_run(run_id).state).is_final() and time.monotonic() < deadline:
            shown += processes_showing(secrets)
            looked_at_the_worker = looked_at_the_worker or processes_showing(["--name gpu-secured"])
            time.sleep(1)
    assert state.is_completed(), secured.log_text()[-3000:]
    assert looked_at_the_worker and not shown

    run, prefect_records = asyncio.run(everything_the_run_left(secured.api_url, auth, run_id))
    s3 = s3_client()
    keys = [o["Key"] for o in s3.list_objects_v2(Bucket=s3_bucket, Prefix="registry/")["Contents"]]
    assert "registry/secured/1/registration.json" in keys
    records = [s3.get_object(Bucket=s3_bucket, Key=k)["Body"].read() for k in keys if not k.endswith((".pt", ".onnx"))]
    files = [p for p in (tmp_path / "runs").rglob("*") if p.is_file() and p.suffix in {".json", ".csv", ".txt"}]
    written = "\n".join(
        [*(r.decode(errors="replace") for r in records), *(p.read_text(errors="replace") for p in files)]
    )
    for secret in secrets:
        assert secret not in prefect_records and secret not in written and secret not in secured.log_text()


@pytest.mark.integration
def test_the_ui_asks_for_the_credentials_and_works_once_given(secured, tmp_path):
    from selenium.webdriver.common.by import By
    from selenium.webdriver.common.keys import Keys
    from selenium.webdriver.support import expected_conditions
    from selenium.webdriver.support.ui import WebDriverWait

    from tests.browser import chromium, wait_for_text

    driver = chromium(tmp_path / "chromium")
    try:
        driver.get(f"{secured.url}/deployments")
        field = WebDriverWait(driver, 60).until(
            expected_conditions.visibility_of_element_located((By.CSS_SELECTOR, "input[type=password]"))
        )
        assert "retrain-digits" not in driver.find_element(By.TAG_NAME, "body").text
        field.send_keys(secured.auth_file.read_text().strip(), Keys.ENTER)
        wait_for_text(driver, ["retrain-digits", "score-images"], timeout=60)
    finally:
        driver.quit()
