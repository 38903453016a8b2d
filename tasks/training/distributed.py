"""This process's place in the training: torchrun's variables, the device, the process group, and the few
collectives the loop needs. No Prefect, no data, no model."""

from __future__ import annotations

import datetime
import os
from dataclasses import dataclass

import torch
import torch.distributed as dist

from tasks.contracts.training_config import TrainingParams
from tasks.errors import InvalidTrainingSetupError


@dataclass(frozen=True)
class DistributedEnv:
    rank: int
    world_size: int
    local_rank: int
    local_world_size: int  # processes on this machine
    restart_count: int

    @classmethod
    def from_environ(cls) -> DistributedEnv:
        """torchrun's variables; a plain ``python -m`` start is a world of one."""
        return cls(
            rank=int(os.environ.get("RANK", 0)),
            world_size=int(os.environ.get("WORLD_SIZE", 1)),
            local_rank=int(os.environ.get("LOCAL_RANK", 0)),
            local_world_size=int(os.environ.get("LOCAL_WORLD_SIZE", 1)),
            restart_count=int(os.environ.get("TORCHELASTIC_RESTART_COUNT", 0)),
        )

    @property
    def is_main(self) -> bool:
        return self.rank == 0


def check_gpus(processes_per_node: int, gpus: int) -> None:
    """One process per GPU: NCCL refuses two ranks on one device, deep inside its setup."""
    if gpus == 0:
        raise InvalidTrainingSetupError(
            f"device is 'cuda' but torch {torch.__version__} sees no CUDA device on this host: "
            "use device 'auto' or 'cpu', or run on a GPU worker"
        )
    if processes_per_node > gpus:
        raise InvalidTrainingSetupError(
            f"processes_per_node is {processes_per_node} but this host has {gpus} CUDA device(s): use at most "
            f"one process per GPU (processes_per_node={gpus})"
        )


def choose_device(env: DistributedEnv, params: TrainingParams) -> torch.device:
    """This rank's GPU (one per process, checked), or the CPU."""
    if params.device == "cuda" or (params.device == "auto" and torch.cuda.is_available()):
        check_gpus(env.local_world_size, torch.cuda.device_count())
        torch.cuda.set_device(env.local_rank)
        # Input sizes are fixed, so cuDNN's per-shape algorithm search pays for itself after one batch.
        torch.backends.cudnn.benchmark = True
        return torch.device("cuda", env.local_rank)
    return torch.device("cpu")


def join_process_group(env: DistributedEnv, device: torch.device, params: TrainingParams) -> None:
    """NCCL on GPU, Gloo on CPU, through torchrun's store; nothing for a world of one."""
    if env.world_size == 1:
        return
    store, _, _ = next(dist.rendezvous("env://"))
    # After a restart torchrun can hand the new worker group the store the failed group used; without a
    # per-restart prefix the new ranks may read the dead ranks' addresses and fail to connect.
    store = dist.PrefixStore(f"restart-{env.restart_count}", store)
    # A collective that waits longer than this fails instead of hanging for torch's default 10-30 minutes.
    dist.init_process_group(
        backend="nccl" if device.type == "cuda" else "gloo",
        store=store,
        rank=env.rank,
        world_size=env.world_size,
        timeout=datetime.timedelta(seconds=params.collective_timeout_s),
    )


def backend_name() -> str:
    return dist.get_backend() if dist.is_initialized() else "single process"


def all_reduce_sum(values: list[float], device: torch.device) -> list[float]:
    """``values`` summed over every rank (as they are, alone)."""
    tensor = torch.tensor(values, dtype=torch.float64, device=device)
    if dist.is_initialized():
        dist.all_reduce(tensor)
    return tensor.tolist()


def share_buffers_of_rank_0(model: torch.nn.Module) -> None:
    """Each rank's last forward pass moved its own BatchNorm statistics: rank 0's go to every rank, so the
    figures every rank computes describe exactly the weights rank 0 writes."""
    if dist.is_initialized():
        for buffer in model.buffers():
            dist.broadcast(buffer, src=0)


def leave_process_group() -> None:
    """Nobody leaves before rank 0 has written the last files."""
    if dist.is_initialized():
        dist.barrier()
        dist.destroy_process_group()
