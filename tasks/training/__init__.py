"""The torchrun training worker and what it needs: plain PyTorch, no Prefect import.

    worker.py       get_args_parser() / main(args): set up, resume, one epoch at a time, save; per-rank logs
    distributed.py  torchrun's variables, the device, the process group, the collectives
    data.py         the datasets, the seeded shard sampler, the loaders, the decoded-image cache's share
    loop.py         optimiser and schedule, one epoch, validation, the finite check
    fine_tuning.py  fine_tuning all / head: the parameter groups, the frozen backbone
    checkpoint.py   the resume state, saved and restored on every rank
    batches.py      batches that never hold a single image (BatchNorm)
    lifeline.py     process hygiene shared by launcher and worker: parent-death signal, heartbeats, failure records

The worker imports only downward: contracts, errors, memory, allocator, vision and this package.
"""
