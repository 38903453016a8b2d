import pytest

from tasks.launch.torchrun_output import LineLevels

pytestmark = pytest.mark.integration


def test_each_line_keeps_the_level_it_was_logged_at():
    levels = LineLevels()
    lines = [
        ("[rank 0] INFO epoch 1/5 batch 10/20 loss 0.3", "INFO"),
        ("[rank 1] WARNING something odd", "WARNING"),
        ("[rank 0] ERROR TRAINING FAILED on rank 0", "ERROR"),
        ("Traceback (most recent call last):", "ERROR"),
        ('  File "worker.py", line 3, in main', "ERROR"),
        (
            "W1122 06:01:02.123000 1234 torch/distributed/elastic/agent/server/api.py:719] Received Signals.SIGTERM",
            "WARNING",
        ),
        (
            "E1122 07:48:24.994000 14627 torch/distributed/elastic/multiprocessing/api.py:1002] failed (exitcode: 1)",
            "ERROR",
        ),
        ("Traceback (most recent call last):", "INFO"),
        ("torch.distributed.elastic.multiprocessing.errors.ChildFailedError: ", "INFO"),
        ("[rank 0] INFO done", "INFO"),
    ]
    import logging

    assert [logging.getLevelName(levels(line)) for line, _ in lines] == [level for _, level in lines]
