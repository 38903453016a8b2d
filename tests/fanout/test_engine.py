"""The fan-out engine on a real Prefect server (the session's), with no worker: the children are runs of a
deployment of a small flow that nobody picks up, and the test sets their states through the API as a worker, the
lost-host automation or a timeout would. Nothing is trained; the gangs, sweeps and sharded scorings that use the
engine are tested end to end in tests/flows/."""

import pytest
import yaml
from prefect import flow

from deployments.deploy import rerun_by_automation
from deployments.local import PROJECT_ROOT
from tasks.fanout.decisions import Outcome, RerunRule, Verdict
from tasks.fanout.engine import FanOut, cancel_unfinished, read_runs

pytestmark = pytest.mark.integration

POOL = "fanout-test"


@flow(name="fanout-child")
def child(x: int, replaces_run: str | None = None) -> int:
    return x


@pytest.fixture(scope="module")
def deployment(prefect_server):
    """``fanout-child/test`` in work pool ``fanout-test`` (no worker polls it); yields the client."""
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.actions import WorkPoolCreate
    from prefect.exceptions import ObjectAlreadyExists

    with get_client(sync_client=True) as client:
        try:
            client.create_work_pool(WorkPoolCreate(name=POOL, type="process"))
        except ObjectAlreadyExists:
            pass
        client.create_deployment(flow_id=client.create_flow(child), name="test", work_pool_name=POOL)
        yield client


def test_the_engine_reruns_a_crashed_child_until_its_budget_is_spent_and_cancels_the_rest(deployment):
    from prefect.states import Completed, Crashed

    client = deployment

    @flow(name="fanout-parent")
    def parent() -> dict:
        fan = FanOut(
            "fanout-child/test",
            label="part",
            what="the test fans out",
            queue="fanout-engine-test",
            limit=2,
            rule=RerunRule(max_reruns=1),
            cancel_message="cancelled with its test",
            poll_seconds=0.05,
        )
        with fan:
            queue = client.read_work_queue_by_name("fanout-engine-test", work_pool_name=POOL)
            lost, done, left = (fan.submit(k, {"x": k}) for k in range(3))
            first = lost.run
            client.set_flow_run_state(lost.flow_run_id, Crashed(message="No heartbeat"), force=True)
            client.set_flow_run_state(done.flow_run_id, Completed(), force=True)
            look = fan.look()
            again, verdicts = lost.run, {c.key: c.decision.verdict for c in look.looked}
            client.set_flow_run_state(lost.flow_run_id, Crashed(message="No heartbeat again"), force=True)
            second = fan.look()
            return {
                "queue": queue,
                "first": first,
                "again": again,
                "verdicts": verdicts,
                "found": [[c.key for c in found] for found in (look.changed, look.rerun, look.ended)],
                "looked": [c.key for c in second.looked],
                "ended": [c.key for c in second.ended],
                "spent": (lost.decision.verdict, lost.decision.why, lost.said, lost.reruns),
                "ids": [c.flow_run_id for c in (lost, done, left)],
            }

    found = parent()
    assert found["queue"].concurrency_limit == 2, "the fan-out's own queue holds its limit"
    assert found["verdicts"] == {0: Verdict.RERUN, 1: Verdict.COMPLETED, 2: Verdict.WAITING}
    assert found["found"] == [[0, 1], [0], [1]], "changed: the re-run and the completed; ended: the completed"
    first, again = found["first"], found["again"]
    assert again.name == f"{first.name}-rerun-1" and again.work_queue_name == "fanout-engine-test"
    assert again.parameters == {"x": 0, "replaces_run": str(first.id)}, (
        "the lost run's parameters, and which it replaces"
    )
    assert found["looked"] == [0, 2], "a settled child is no longer looked at"
    assert found["ended"] == [0] and found["spent"] == (
        Verdict.SPENT,
        "crashed, and was run 1 time again",
        "No heartbeat again",
        1,
    )
    lost, done, left = (client.read_flow_run(run_id) for run_id in found["ids"])
    assert lost.state.is_crashed() and done.state.is_completed(), "ended runs are left as they ended"
    assert left.state.is_cancelled() and left.state.message == "cancelled with its test", "no child runs on alone"
    names = [q.name for q in client.read_work_queues(work_pool_name=POOL)]
    assert "fanout-engine-test" not in names, "the fan-out's queue is gone with it"


def test_the_loop_ends_when_the_completion_rule_says_and_the_children_it_names_lost_are_ended_crashed(deployment):
    from prefect.states import Completed, Running

    client = deployment

    def rule(fan) -> Outcome:
        """Done once child 0 completed; child 1, still Running, lost with its host."""
        done = fan.children[0].run.state.is_completed()
        return Outcome(done=done, lost={1: "node 1: its host was lost"} if done else {})

    @flow(name="fanout-parent")
    def parent() -> list:
        fan = FanOut(
            "fanout-child/test",
            label="node",
            what="the test fans out",
            queue="fanout-rule-test",
            cancel_message="cancelled with its test",
            policy=rule,
            poll_seconds=0.05,
        )
        with fan:
            children = [fan.submit(k, {"x": k}) for k in range(3)]
            for child in children[:2]:
                client.set_flow_run_state(child.flow_run_id, Running(), force=True)
            for _ in fan.looks():  # the first look finds both running; child 0 completes before the second
                client.set_flow_run_state(children[0].flow_run_id, Completed(), force=True)
            return [child.flow_run_id for child in children]

    completed, lost, waiting = (client.read_flow_run(run_id) for run_id in parent())
    assert completed.state.is_completed()
    assert lost.state.is_crashed() and lost.state.message == "node 1: its host was lost", "ended by the engine"
    assert waiting.state.is_cancelled(), "a child that never started is cancelled on the way out"


def test_a_look_reads_every_child_in_one_request_and_pages_past_the_servers_limit(deployment):
    """``read_runs`` asks for every id at once; a server whose page is smaller than the ids (its
    PREFECT_SERVER_API_DEFAULT_LIMIT, 200 unless raised) is asked again for the ones it did not return."""
    client = deployment
    made = [client.create_flow_run_from_deployment(client.read_deployment_by_name("fanout-child/test").id)]
    made += [client.create_flow_run_from_deployment(made[0].deployment_id) for _ in range(4)]
    ids = [str(run.id) for run in made]

    class Paged:
        """The server's client, its pages cut to ``size`` runs and its requests counted."""

        def __init__(self, size: int | None) -> None:
            self.size, self.requests = size, 0

        def read_flow_runs(self, **filters):
            self.requests += 1
            return client.read_flow_runs(**filters)[: self.size]

    whole, paged = Paged(None), Paged(2)
    assert set(read_runs(whole, ids)) == set(ids) and whole.requests == 1, "one request a look"
    assert set(read_runs(paged, ids)) == set(ids) and paged.requests == 3, "5 runs in pages of 2"
    cancel_unfinished(client, ids, "done with")


def test_a_child_left_cancelling_by_a_lost_worker_is_set_cancelled_through_the_api(deployment):
    from prefect.states import Running

    client = deployment
    stuck = client.create_flow_run_from_deployment(client.read_deployment_by_name("fanout-child/test").id)
    client.set_flow_run_state(stuck.id, Running(), force=True)
    (ended,) = cancel_unfinished(client, [stuck.id], "cancelled with the other nodes", wait_seconds=1.0)
    assert ended.state.is_cancelled() and "no worker ended it within 1 s" in ended.state.message


def test_a_child_that_reports_itself_crashed_when_its_worker_stops_it_ends_cancelled(deployment):
    """Stopped by its worker, a run's process may report Crashed before the worker marks it Cancelled: the engine
    does not leave it Crashed (as a gang's test would read it the moment the gang's cancellation is over)."""
    import threading

    from prefect.client.orchestration import get_client
    from prefect.states import Crashed, Running

    client = deployment
    stopped = client.create_flow_run_from_deployment(client.read_deployment_by_name("fanout-child/test").id)
    client.set_flow_run_state(stopped.id, Running(), force=True)

    def its_process_reports_crashed() -> None:
        with get_client(sync_client=True) as its_client:
            aborted = Crashed(message="Execution was aborted by a termination signal.")
            its_client.set_flow_run_state(stopped.id, aborted, force=True)

    threading.Timer(0.3, its_process_reports_crashed).start()
    (ended,) = cancel_unfinished(client, [stopped.id], "cancelled with the other nodes", wait_seconds=30.0)
    assert ended.state.is_cancelled(), ended.state
    assert ended.state.message == "cancelled with the other nodes (Execution was aborted by a termination signal.)"


def test_no_child_of_a_fan_out_is_also_run_again_by_the_automation():
    """The automation re-runs crashed train-pipeline runs; the engine re-runs crashed children of a fan-out (or,
    for a gang, the train task's retry re-runs them all): no crashed run is run again twice."""
    from deployments.deploy import deployment_names
    from tasks.launch.multinode import NODE_DEPLOYMENT
    from tasks.score_shards.parts import SHARD_DEPLOYMENTS
    from tasks.sweep.study import TRIAL_DEPLOYMENT

    config = yaml.safe_load((PROJECT_ROOT / "deployments" / "prefect.yaml").read_text())
    names = deployment_names(config)
    by_automation = {name for name, rerun in zip(names, rerun_by_automation(config)) if rerun}
    children = {NODE_DEPLOYMENT, TRIAL_DEPLOYMENT, *SHARD_DEPLOYMENTS.values()}
    assert by_automation and children <= set(names), (by_automation, children, names)
    assert not by_automation & children
