"""How a training is started and watched: ``torchrun_launcher`` (launch_training, the one way to train: the torchrun
command, its environment, its output streamed and its heartbeats watched), ``torchrun_output`` (what a training
leaves and prints), ``train`` (the train task), ``multinode`` (nodes > 1 through the work pool; the fan-out helpers
the sweeps and sharded scoring share) and ``lost_runs`` (a run replacing crashed ones). The worker itself is
tasks/training/. Nothing is imported here: importing the package imports neither torch nor Prefect."""
