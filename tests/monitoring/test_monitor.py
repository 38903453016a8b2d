"""The monitor on the real Prefect server: a window of real answers like the validation set's is no drift; grey,
larger photos are, with the artifact ``model-drift`` (figures and pictures) and the event
``image-classifier.model.drift`` about the version; a damaged segment and another model's records are named and
left out; the command's mistakes are one line and exit status 2."""

import asyncio

import pytest
from prefect.client.orchestration import get_client

from flows.monitor import main, monitor_pipeline
from tasks.inference.loaded import LoadedModel
from tasks.monitoring.events import DRIFT_EVENT
from tasks.monitoring.prefect_tasks import ARTIFACT_KEY
from tasks.monitoring.records import RecordFolder, encode
from tests.conftest import drain_prefect_workers
from tests.helpers import NAME, artifacts_and_task_runs, main_in_process, wait_for
from tests.monitoring.answers import answer, photos, publish

SINCE = "2026-11-29T11:30:00Z"  # the records' START less half an hour
RESOURCE = f"image-classifier.model.{NAME}.1"


def drift_events() -> list[dict]:
    with get_client(sync_client=True) as client:
        response = client._client.post(
            "/events/filter",
            json={"filter": {"event": {"name": [DRIFT_EVENT]}, "resource": {"id": [RESOURCE]}}, "limit": 50},
        )
    return response.json()["events"]


def more_than(count: int) -> list[dict] | None:
    found = drift_events()
    return found if len(found) > count else None


def test_drift_is_published_with_pictures_and_an_event_about_the_version(prefect_server, watched, tmp_path, capsys):
    model = LoadedModel.load(f"{NAME}/1", str(watched))
    calm, shifted = str(tmp_path / "calm"), str(tmp_path / "shifted")
    publish(calm, answer(model, photos(110)))
    RecordFolder(calm).publish("20261129T120100Z-1-2.jsonl.gz", encode([{"time": "cut"}])[:15])
    other = answer(model, photos(3))
    publish(calm, [{**record, "model": "cats"} for record in other], sequence=3)
    before = len(drift_events())

    state = monitor_pipeline(NAME, calm, SINCE, str(watched), return_state=True)
    report = state.result()
    assert not report.drifted and report.records == 110 and state.message == report.headline()
    artifacts, _ = asyncio.run(artifacts_and_task_runs(state.state_details.flow_run_id))
    (artifact,) = [a for a in artifacts if a.key == ARTIFACT_KEY]
    assert "| confidence | Kolmogorov-Smirnov |" in artifact.data and artifact.data.count("data:image/png") == 3
    assert "segment 20261129T120100Z-1-2.jsonl.gz skipped" in artifact.data
    assert "3 records of other models left out" in artifact.data

    publish(shifted, answer(model, photos(110, grey=True, size=24)))
    assert (
        main([NAME, "--records", shifted, "--since", SINCE, "--registry", str(watched), "--work-dir", str(tmp_path)])
        == 0
    )
    printed = capsys.readouterr().out
    assert f"{NAME}/1: drift in " in printed and "DRIFT" in printed
    drain_prefect_workers()
    # The server stores events in batches, a few seconds after they arrive.
    events = wait_for(lambda: more_than(before), 60, interval=0.5, what="the drift event")
    assert len(events) == before + 1
    assert any(related["prefect.resource.id"].startswith("prefect.flow-run.") for related in events[0]["related"])
    payload = events[0]["payload"]
    assert payload["version"] == 1 and any(f["name"] == "mode" and f["drifted"] for f in payload["figures"])


@pytest.mark.parametrize(
    ("arguments", "told"),
    [
        (["--records", "no-such-folder"], "no-such-folder: no such folder of records"),
        (["--since", "yesterday"], "since 'yesterday' is neither a duration (30m, 1h, 2d) nor a time"),
        (["--model-as-folder"], "is a model folder: monitoring watches a registered version"),
    ],
)
def test_a_mistake_is_one_line_and_exit_2(watched, tmp_path, arguments, told):
    model = str(tmp_path) if arguments == ["--model-as-folder"] else NAME
    given = [] if arguments == ["--model-as-folder"] else arguments
    argv = [model, "--registry", str(watched), "--work-dir", str(tmp_path)]
    if "--records" not in given:
        argv += ["--records", str(tmp_path)]
    done = main_in_process(main, argv + given)
    assert done.returncode == 2 and told in done.stderr and done.stderr.count("\n") == 1, done.stderr
