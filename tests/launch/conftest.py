"""What the launch tests share."""

import pytest


@pytest.fixture
def node_runs(prefect_server):
    """Make ``n`` flow runs of a small flow, as a multi-node training's node runs are, on the real server."""
    from prefect import flow
    from prefect.client.orchestration import get_client

    @flow(name="node-run")
    def node_run() -> None: ...

    with get_client(sync_client=True) as client:
        yield client, lambda n: [client.create_flow_run(node_run) for _ in range(n)]
