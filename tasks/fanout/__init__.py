"""The one fan-out engine (``engine.FanOut``): child flow runs of a deployment through a work queue of their own,
watched under one rule (``decisions``), and the runs that replace lost ones (``reruns``). Nothing is imported
here, so ``tasks.fanout.decisions`` stays importable without Prefect."""
