"""tasks/launch/multinode.py: its constants agree with what is deployed; the gang's completion rule (GangRule) on
node runs' states (the engine that asks it: tests/fanout/test_engine.py; whole gangs: tests/flows/)."""

from datetime import datetime, timedelta, timezone

from deployments.local import PROJECT_ROOT
from tasks.contracts.training_config import TrainingParams
from tasks.launch.multinode import ELASTIC_FINISH_GRACE_SECONDS


def test_the_node_deployment_the_train_stage_submits_is_the_one_deployments_prefect_yaml_defines():
    import importlib

    import yaml

    from tasks.launch.multinode import NODE_DEPLOYMENT

    deployments = yaml.safe_load((PROJECT_ROOT / "deployments" / "prefect.yaml").read_text())["deployments"]
    defined = set()
    for deployment in deployments:
        module, function = deployment["entrypoint"].split(":")
        flow = getattr(importlib.import_module(module.removesuffix(".py").replace("/", ".")), function)
        defined.add(f"{flow.name}/{deployment['name']}")
    assert NODE_DEPLOYMENT in defined, defined


def gang(*states, pool: str = "gpu", workers=()):
    """A fan-out of node runs in ``states`` (rank order), as the gang's rule reads it."""
    from types import SimpleNamespace

    children = {
        rank: SimpleNamespace(run=SimpleNamespace(name=f"run-{rank}", state=s)) for rank, s in enumerate(states)
    }
    return SimpleNamespace(children=children, pool=pool, workers=lambda: list(workers))


def test_the_gangs_rule_fails_a_fixed_gang_with_any_node_and_is_done_once_all_completed():
    import pytest
    from prefect.states import Completed, Failed, Running

    from tasks.errors import TrainingNodeFailedError
    from tasks.fanout.decisions import Outcome
    from tasks.launch.multinode import GangRule

    rule = GangRule(TrainingParams(nodes=2))
    assert rule(gang(Running(), Completed())) == Outcome(done=False)
    assert rule(gang(Completed(), Completed())) == Outcome(done=True)
    with pytest.raises(
        TrainingNodeFailedError, match=r"training node 1 \(flow run 'run-1'\) ended Failed: out of memory"
    ):
        rule(gang(Running(), Failed(message="out of memory")))


def test_an_elastic_gang_ends_the_runs_still_going_past_the_grace_after_another_completed_as_lost():
    from prefect.states import Completed, Running, Scheduled

    from tasks.launch.multinode import GangRule

    rule = GangRule(TrainingParams(nodes="1:3"))
    assert not rule(gang(Completed(), Running(), Scheduled())).done, "within the grace: the host may still report"
    long_ago = datetime.now(timezone.utc) - timedelta(seconds=ELASTIC_FINISH_GRACE_SECONDS + 1)
    outcome = rule(gang(Completed(timestamp=long_ago), Running(), Scheduled()))
    assert outcome.done and list(outcome.lost) == [1], "the never-started run is left to the engine to cancel"
    assert outcome.lost[1].startswith("node 1: still Running") and "host was lost with its worker" in outcome.lost[1]


def test_the_gangs_rule_fails_when_too_few_nodes_started_within_the_join_timeout():
    import pytest
    from prefect.states import Running, Scheduled

    from tasks.errors import NodesNotJoinedError
    from tasks.launch.multinode import GangRule

    rule = GangRule(TrainingParams(nodes=2, join_timeout_s=60))
    assert not rule(gang(Running(), Scheduled())).done, "joining: the first look starts the join timeout"
    rule.joined_by -= 61
    with pytest.raises(NodesNotJoinedError, match="only 1 of 2 training nodes started within 60 s.*no worker at all"):
        rule(gang(Running(), Scheduled()))
