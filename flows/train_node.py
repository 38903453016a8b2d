"""One node of a multi-node training: the ``train-node`` deployment (deployments/prefect.yaml, work pool ``gpu``).

The train stage submits one run per node (tasks/launch/multinode.py) as its subflows; not meant to be run by hand.
"""

from __future__ import annotations

from prefect import flow
from prefect.states import State

from tasks.contracts.training_config import TrainingFolders, TrainingParams
from tasks.errors import TrainingFailedError
from tasks.launch.prefect_nodes import cancelled_with_its_gang, find_rendezvous, train_node


@flow(name="train-node", log_prints=True)
def train_node_flow(
    folders: TrainingFolders,
    params: TrainingParams,
    node_rank: int,
    rendezvous_key: str,
) -> str | State:
    """Launch this host's share of a multi-node training (processes_per_node processes) and wait for it: the model
    folder, or the run's Cancelled state when its training failed because its gang was being cancelled.

    Args:
        folders: The training's ImageDirectories and UntrainedModelDirectory, and the ModelDirectory every node
            writes into (rank 0 the model files, each rank its log).
        params: Training parameters, the same on every node.
        node_rank: This node's number among the runs the train stage submitted (names it in logs).
        rendezvous_key: Prefect Variable where the first node to start publishes its endpoint (and the rendezvous id).
    """
    rendezvous = find_rendezvous(params, node_rank, rendezvous_key)
    try:
        return train_node(folders, params, rendezvous)
    except TrainingFailedError as failed:
        # A peer stopped by the gang's cancellation fails this node's training too: then it ends Cancelled.
        return cancelled_with_its_gang(node_rank, failed)
