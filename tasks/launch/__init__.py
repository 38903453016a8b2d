"""How a training is started and watched: ``torchrun_launcher`` (launch_training, the one way to train: the torchrun
command, its environment, its output streamed and its heartbeats watched), ``torchrun_output`` (what a training
leaves and prints), ``multinode`` (nodes > 1: the rendezvous, the node runs' parameters, when the nodes are done
or failed; no Prefect), ``lost_runs`` (where a run replacing a lost one stands; no Prefect), ``prefect_tasks`` (the
task ``train``; a lost run taken over) and ``prefect_nodes`` (a node's run: ``find_rendezvous``, ``train_node``; the
node runs submitted and watched through the fan-out engine, tasks/fanout). The worker itself is tasks/training/.
Nothing is imported here: importing the package imports neither torch nor Prefect."""
