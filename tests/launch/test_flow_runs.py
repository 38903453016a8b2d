from tasks.launch import flow_runs


def test_a_node_run_left_cancelling_by_a_lost_worker_is_set_cancelled_through_the_api(node_runs):
    from prefect.states import Running

    client, make = node_runs
    (stuck,) = make(1)
    client.set_flow_run_state(stuck.id, Running(), force=True)
    (ended,) = flow_runs.cancel_unfinished(client, [stuck], "cancelled with the other nodes", wait_seconds=1.0)
    assert ended.state.is_cancelled() and "no worker ended it within 1 s" in ended.state.message
