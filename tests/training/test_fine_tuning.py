"""Fine-tuning modes: the optimizer's parameter groups, their resume, and head-only training through torchrun."""

import pytest
import torch
from pydantic import ValidationError

from tasks.contracts.model_directory import WEIGHTS_FILE, ModelSpec, TrainingMetrics, read_model_spec
from tasks.contracts.training_config import TrainingParams, params_from_flags, training_flags
from tasks.training.checkpoint import read_checkpoint, rescale_schedule, restore_checkpoint, save_checkpoint
from tasks.training.loop import make_optimizer, warmup_poly_schedule
from tasks.training.worker import get_args_parser
from tasks.vision.networks import build_network
from tests.helpers import run_worker


def network(architecture: str = "resnet18") -> torch.nn.Module:
    torch.manual_seed(0)
    return build_network(ModelSpec(architecture=architecture), 3)


def test_the_default_is_one_group_of_every_parameter_as_before():
    model = network()
    optimizer = make_optimizer(model, 0.1, TrainingParams(), "resnet18")
    assert len(optimizer.param_groups) == 1
    assert optimizer.param_groups[0]["params"] == list(model.parameters())


def test_backbone_lr_factor_gives_the_backbone_a_lower_rate_than_the_head():
    model = network()
    optimizer = make_optimizer(model, 0.1, TrainingParams(backbone_lr_factor=0.25), "resnet18")
    head, backbone = optimizer.param_groups
    assert head["params"] == [model.fc.weight, model.fc.bias] and head["lr"] == 0.1
    assert len(backbone["params"]) == len(list(model.parameters())) - 2
    assert backbone["lr"] == pytest.approx(0.025) and backbone["lr_factor"] == 0.25
    assert head["fused"] and backbone["fused"] and backbone["nesterov"]


def test_head_mode_optimizes_the_head_alone_and_refuses_a_factor():
    model = network()
    optimizer = make_optimizer(model, 0.1, TrainingParams(fine_tuning="head"), "resnet18")
    assert [group["params"] for group in optimizer.param_groups] == [[model.fc.weight, model.fc.bias]]
    with pytest.raises(ValidationError, match="backbone_lr_factor is 0.1 but fine_tuning is 'head'"):
        TrainingParams(fine_tuning="head", backbone_lr_factor=0.1)


def test_the_modes_are_worker_flags():
    params = TrainingParams(backbone_lr_factor=0.1)
    assert "--backbone-lr-factor" in training_flags(params)
    args = get_args_parser().parse_args(
        ["--train", "t", "--validation", "v", "--model-spec", "m", "--output", "o", *training_flags(params)]
    )
    assert params_from_flags(args) == params


def steps(model, optimizer, scheduler, count: int) -> None:
    for _ in range(count):
        generator = torch.Generator().manual_seed(scheduler.last_epoch)  # the same batch at the same step
        images, labels = torch.randn(4, 3, 16, 16, generator=generator), torch.tensor([0, 1, 2, 0])
        optimizer.zero_grad()
        torch.nn.functional.cross_entropy(model(images), labels).backward()
        optimizer.step()
        scheduler.step()


def test_two_groups_resume_from_a_checkpoint_to_the_unbroken_result(tmp_path):
    params = TrainingParams(backbone_lr_factor=0.1, momentum=0.9)

    def fresh():
        model = network()
        optimizer = make_optimizer(model, 0.1, params, "resnet18")
        return model, optimizer, torch.optim.lr_scheduler.LambdaLR(optimizer, warmup_poly_schedule(1, 6))

    unbroken = fresh()
    steps(*unbroken, 4)

    first = fresh()
    steps(*first, 2)
    save_checkpoint(tmp_path / "last.pt", *first, TrainingMetrics(), ["a", "b", "c"], config={})
    resumed = fresh()
    restore_checkpoint(read_checkpoint(tmp_path / "last.pt"), tmp_path, *resumed, ["a", "b", "c"])
    assert [g["lr"] for g in resumed[1].param_groups] == [g["lr"] for g in first[1].param_groups]
    steps(*resumed, 2)
    for a, b in zip(unbroken[0].state_dict().values(), resumed[0].state_dict().values()):
        assert torch.equal(a, b)


def test_rescaling_the_schedule_keeps_the_backbones_factor():
    model = network()
    optimizer = make_optimizer(model, 0.2, TrainingParams(backbone_lr_factor=0.5), "resnet18")
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, warmup_poly_schedule(0, 10))
    lr = rescale_schedule(optimizer, scheduler, base_lr=0.4, step=5)
    assert lr == pytest.approx(0.2) and optimizer.param_groups[1]["lr"] == pytest.approx(0.1)
    assert scheduler.base_lrs == [0.4, 0.2]
    optimizer.step()  # no gradients yet: only the schedule moves
    scheduler.step()
    assert [g["lr"] for g in optimizer.param_groups] == pytest.approx([0.4 * 0.4, 0.2 * 0.4])


@pytest.mark.integration
def test_head_only_training_leaves_every_backbone_tensor_as_it_started(tmp_path, colour_image_dirs, resnet_spec):
    train, val = colour_image_dirs
    output = tmp_path / "model"
    result = run_worker(
        *("--train", str(train), "--validation", str(val), "--model-spec", str(resnet_spec)),
        *("--output", str(output), "--epochs", "1", "--batch-size", "4", "--learning-rate", "0.05"),
        *("--fine-tuning", "head", "--random-seed", "5"),
        processes=1,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "fine-tuning head: head fc (1539 parameters)" in result.stdout

    torch.manual_seed(5)  # the worker's seed before it builds the network
    initial = build_network(read_model_spec(resnet_spec), 3).state_dict()
    trained = torch.load(output / WEIGHTS_FILE, weights_only=True)
    assert trained.keys() == initial.keys()
    backbone = [key for key in initial if not key.startswith("fc.")]
    assert any(key.endswith("running_mean") for key in backbone) and "bn1.num_batches_tracked" in backbone
    assert [key for key in backbone if not torch.equal(trained[key], initial[key])] == []
    assert not torch.equal(trained["fc.weight"], initial["fc.weight"])
