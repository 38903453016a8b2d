"""How a training is started and watched: ``torchrun_launcher`` (launch_training, the one way to train: the torchrun
command, its environment, its output streamed and its heartbeats watched), ``torchrun_output`` (what a training
leaves and prints), ``multinode`` (nodes > 1: the rendezvous, the node runs' parameters, when the nodes are done
or failed; no Prefect), ``flow_runs`` (the Prefect client side of every fan-out through the work pool, shared
with sweeps and sharded scoring: a deployment required, a work queue of its own, a crashed run submitted again,
runs cancelled), ``lost_runs`` (a run replacing crashed ones) and ``prefect_tasks`` (the tasks ``train``,
``find_rendezvous`` and ``train_node``; the node runs submitted and watched). The worker itself is
tasks/training/. Nothing is imported here: importing the package imports neither torch nor Prefect."""
