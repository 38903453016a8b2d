"""The train stage ends the node runs that no worker is left to end, on a real Prefect server (the session's)."""

import time

from tasks.launch import multinode, prefect_nodes


def test_a_node_still_running_past_the_grace_after_another_completed_is_set_crashed(node_runs, monkeypatch):
    from prefect.states import Completed, Running

    client, make = node_runs
    done, lost = make(2)
    for run, states in ((done, (Running(), Completed())), (lost, (Running(),))):
        for state in states:
            client.set_flow_run_state(run.id, state, force=True)
    warnings = []
    read = [client.read_flow_run(run.id) for run in (done, lost)]
    prefect_nodes.end_lost_nodes(client, read, lambda level, message: warnings.append(message))
    assert client.read_flow_run(lost.id).state.is_running()  # within the grace: the host may still report
    monkeypatch.setattr(multinode, "ELASTIC_FINISH_GRACE_SECONDS", 0.0)
    time.sleep(0.05)
    prefect_nodes.end_lost_nodes(client, read, lambda level, message: warnings.append(message))
    ended = client.read_flow_run(lost.id).state
    assert ended.is_crashed() and "host was lost with its worker" in ended.message
    assert client.read_flow_run(done.id).state.is_completed()
    assert len(warnings) == 1 and warnings[0].startswith("node 1: still Running")
