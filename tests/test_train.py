import json
import logging
import shutil
import subprocess
import sys

import pytest
import torch
import torchvision

from tasks import PipelineInputError, TrainingFailedError
from tasks.errors import InvalidTrainingSetupError, PretrainedWeightsError
from tasks.launch import build_torchrun_command, launch_training, worker_environment
from tasks.model import write_untrained_model_directory
from tasks.model_directory import (
    CHECKPOINT_FILE,
    MODEL_FILES,
    STAGED_WEIGHTS_FILE,
    EpochMetrics,
    ModelDirectory,
    ModelSpec,
    TrainingMetrics,
    driver_log_path,
)
from tasks.training.config import TrainingFolders, TrainingParams, params_from_flags
from tasks.training.loop import make_optimizer, warmup_poly_schedule
from tasks.training.worker import get_args_parser
from tasks.transformations import ImageTransformations
from tasks.vision.images import ImageFiles
from tasks.vision.transforms import eval_transform, train_transform
from tests.helpers import run_worker, write_class_folders

DIRS = TrainingFolders(train_dir="/d/train", validation_dir="/d/val", model_spec_dir="/d/spec", output_dir="/d/model")


def test_single_node_command_is_standalone_torchrun_of_the_worker():
    command = build_torchrun_command(DIRS, params=TrainingParams(processes_per_node=2), python="py")
    assert command[:3] == ["py", "-m", "torch.distributed.run"]
    assert command[command.index("--nproc-per-node") + 1] == "2"
    assert command[command.index("--nnodes") + 1] == "1"
    assert "--standalone" in command and "--rdzv-backend" not in command
    worker = command.index("-m", 3)
    assert command[worker + 1] == "tasks.training.worker"
    assert command[command.index("--output") + 1] == "/d/model"


def test_multi_node_command_uses_c10d_rendezvous():
    params = TrainingParams(nodes=2, rendezvous_endpoint="10.0.0.1:29400", max_restarts=3)
    command = build_torchrun_command(DIRS, params=params, run_id="run-7")
    assert "--standalone" not in command
    assert command[command.index("--rdzv-backend") + 1] == "c10d"
    assert command[command.index("--rdzv-endpoint") + 1] == "10.0.0.1:29400"
    assert command[command.index("--rdzv-id") + 1] == "run-7"
    assert command[command.index("--max-restarts") + 1] == "3"


def test_a_node_launched_through_the_pool_says_whether_it_serves_the_rendezvous():
    params = TrainingParams(nodes=2, rendezvous_endpoint="10.0.0.1:41234", join_timeout_s=90)
    conf = {is_host: build_torchrun_command(DIRS, params=params, is_host=is_host) for is_host in (True, False, None)}
    assert conf[True][conf[True].index("--rdzv-conf") + 1] == "join_timeout=90,is_host=1"
    assert conf[False][conf[False].index("--rdzv-conf") + 1] == "join_timeout=90,is_host=0"
    assert conf[None][conf[None].index("--rdzv-conf") + 1] == "join_timeout=90"


def test_multi_node_without_endpoint_is_refused_before_launch():
    with pytest.raises(PipelineInputError, match="rendezvous_endpoint"):
        build_torchrun_command(DIRS, params=TrainingParams(nodes=2))


def test_worker_flags_round_trip_to_the_same_params():
    params = TrainingParams(epochs=7, learning_rate=0.05, image_size=48, device="cpu", processes_per_node=2)
    command = build_torchrun_command(DIRS, params=params)
    args = get_args_parser().parse_args(command[command.index("tasks.training.worker") + 1 :])
    assert params_from_flags(args) == params


def test_defaults_are_the_azure_components():
    p = TrainingParams()
    assert (
        p.epochs,
        p.batch_size,
        p.warmup_epochs,
        p.learning_rate,
        p.random_seed,
        p.patience,
        p.print_frequency,
        p.nodes,
        p.processes_per_node,
    ) == (5, 16, 0, 0.001, 1, 3, 10, 1, 1)
    with pytest.raises(ValueError):
        TrainingParams(epochs=0)


def test_environment_shares_cpu_threads_and_makes_the_project_importable():
    env = worker_environment(TrainingParams(processes_per_node=2), base={"PATH": "/bin"})
    assert env["OMP_NUM_THREADS"] == str(max(1, (__import__("os").cpu_count() or 1) // 2))
    assert env["PYTHONUNBUFFERED"] == "1" and env["PYTHONPATH"]


def test_environment_keeps_freed_memory_unless_the_user_set_the_allocator():
    env = worker_environment(TrainingParams(), base={})
    assert int(env["MALLOC_MMAP_THRESHOLD_"]) >= 2**20 and int(env["MALLOC_TRIM_THRESHOLD_"]) >= 2**20
    mine = worker_environment(TrainingParams(), base={"MALLOC_MMAP_THRESHOLD_": "131072"})
    assert mine["MALLOC_MMAP_THRESHOLD_"] == "131072" and "MALLOC_TRIM_THRESHOLD_" not in mine


def test_transforms_compute_what_the_usual_pil_pipeline_computes():
    """Our two-stage transforms (cacheable decode, then crop/normalise on tensors) against the torchvision
    composition everyone writes on PIL images: same random crops from the same seed, same values to the bit."""
    from PIL import Image
    from torchvision import transforms as T

    mean, std = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)
    generator = torch.Generator().manual_seed(0)
    for shape, size in (((8, 8, 3), 32), ((37, 50, 3), 64), ((200, 300, 3), 224)):
        image = Image.fromarray(torch.randint(0, 256, shape, dtype=torch.uint8, generator=generator).numpy())
        usual_train = T.Compose(
            [
                T.Resize((size, size)),
                T.RandomCrop(size, padding=size // 8, padding_mode="edge"),
                T.ToTensor(),
                T.Normalize(mean, std),
            ]
        )
        usual_eval = T.Compose([T.Resize((size, size)), T.ToTensor(), T.Normalize(mean, std)])
        torch.manual_seed(3)
        expected = [usual_train(image) for _ in range(4)]
        torch.manual_seed(3)
        ours = [train_transform(ImageTransformations(), size, mean, std)(image) for _ in range(4)]
        assert all(torch.equal(a, b) for a, b in zip(expected, ours))
        assert torch.equal(usual_eval(image), eval_transform(ImageTransformations(), size, mean, std)(image))
        # The worker normalises whole uint8 batches (on the GPU there): the same bits as image by image.
        transform = train_transform(ImageTransformations(), size, mean, std)
        torch.manual_seed(3)
        pixels = torch.stack([transform.augment(transform.decode(image)) for _ in range(4)])
        assert pixels.dtype == torch.uint8 and torch.equal(transform.normalize(pixels), torch.stack(expected))
        # Other options too: the torchvision classes on PIL images, ours on uint8 tensors, the same bits.
        options = ImageTransformations(
            resize={"size": size + 8, "keep_aspect_ratio": True},
            center_crop=True,
            random_crop={"padding": 0.25, "padding_mode": "reflect"},
            random_horizontal_flip=True,
        )
        usual_train = T.Compose(
            [
                T.Resize(size + 8),
                T.CenterCrop(size),
                T.RandomCrop(size, padding=size // 4, padding_mode="reflect"),
                T.RandomHorizontalFlip(),
                T.ToTensor(),
                T.Normalize(mean, std),
            ]
        )
        torch.manual_seed(3)
        expected = [usual_train(image) for _ in range(4)]
        torch.manual_seed(3)
        assert all(torch.equal(a, train_transform(options, size, mean, std)(image)) for a in expected)
        usual_eval = T.Compose([T.Resize(size + 8), T.CenterCrop(size), T.ToTensor(), T.Normalize(mean, std)])
        assert torch.equal(usual_eval(image), eval_transform(options, size, mean, std)(image))


def test_decoded_images_are_kept_in_memory_up_to_the_budget(tmp_path):
    source = write_class_folders(tmp_path / "images", per_class=3)
    samples = [(path, 0) for path in sorted(source.rglob("*.png"))]
    transform = eval_transform(ImageTransformations(), 32, (0.5,) * 3, (0.5,) * 3)
    uncached = [image for image, _ in ImageFiles(samples, transform)]
    per_image = 3 * 32 * 32
    cached = ImageFiles(samples, transform, cache_bytes=5 * per_image + 7)
    assert cached.cache_capacity == 5 and cached.cached_images == 0
    first = [image for image, _ in cached]
    assert cached.cached_images == 5
    for path, _ in samples:
        path.unlink()  # later epochs read the first five from memory, the rest from disk
    assert all(torch.equal(a, b) for a, b in zip(uncached, first))
    assert all(torch.equal(cached[i][0], uncached[i]) for i in range(5))
    with pytest.raises(FileNotFoundError):
        cached[5]


def test_optimizer_is_fused_nesterov_sgd():
    model = torch.nn.Linear(4, 2)
    optimizer = make_optimizer(model, 0.1, TrainingParams(momentum=0.8, weight_decay=0.01))
    group = optimizer.param_groups[0]
    assert (group["lr"], group["momentum"], group["nesterov"], group["weight_decay"]) == (0.1, 0.8, True, 0.01)
    assert group["fused"]


def test_warmup_then_polynomial_decay():
    factor = warmup_poly_schedule(warmup_steps=4, total_steps=12)
    assert [factor(s) for s in range(4)] == [0.25, 0.5, 0.75, 1.0]
    assert factor(4) == 1.0 and factor(8) == 0.5 and factor(12) == 0.0


def epoch(n, val_loss, top1):
    return EpochMetrics(
        epoch=n,
        lr=0.1,
        train_images_per_s=1,
        train_loss=1,
        train_error=0.5,
        val_loss=val_loss,
        top1=top1,
        top5=1,
        seconds=1,
    )


def test_early_stopping_after_patience_epochs_without_lower_validation_loss():
    metrics = TrainingMetrics()
    bests = [
        metrics.add_epoch(epoch(n, loss, top1), patience=2, total_epochs=10)
        for n, loss, top1 in [(1, 0.9, 0.5), (2, 0.5, 0.7), (3, 0.6, 0.8), (4, 0.7, 0.6)]
    ]
    assert bests == [True, True, True, False]
    assert metrics.stopped_early and metrics.best_epoch == 3 and metrics.lowest_val_loss == 0.5
    last = TrainingMetrics()
    for n, loss in enumerate([0.5, 0.6, 0.7], start=1):
        last.add_epoch(epoch(n, loss, 0.5), patience=2, total_epochs=3)
    assert not last.stopped_early, "finishing on the last epoch is not stopping early"


@pytest.mark.integration
def test_worker_imports_no_prefect():
    code = "import sys, tasks.training.worker; sys.exit('prefect' in sys.modules)"
    assert subprocess.run([sys.executable, "-c", code]).returncode == 0


def test_trained_model_directory_is_complete(trained_model, colour_image_dirs):
    model_dir = ModelDirectory(trained_model)
    assert all((trained_model / name).is_file() for name in MODEL_FILES)
    assert model_dir.classes == ["blue", "green", "red"] and model_dir.spec.num_classes == 3
    assert model_dir.spec.image_size == 32  # 16 px images round up to the 32 px minimum
    metrics = model_dir.metrics()
    assert [e.epoch for e in metrics.epochs] == [1, 2] and metrics.world_size == 2
    assert metrics.best_top1 == max(e.top1 for e in metrics.epochs)
    for epoch in metrics.epochs:
        assert epoch.lr > 0 and epoch.train_images_per_s > 0 and 0 <= epoch.top1 <= epoch.top5 <= 1
    state = torch.load(model_dir.weights_path, weights_only=True)
    assert state["fc.weight"].shape == (3, 512)
    for rank in (0, 1):
        log = driver_log_path(trained_model, rank).read_text()
        assert "training resnet18 on 24 images" in log
        # 1024 MB per machine, 512 MB to each of the 2 processes: every 32 px image fits
        assert "decoded images kept in memory: 24 of 24 training, 12 of 12 validation" in log
    header = (trained_model / "training_log.csv").read_text().splitlines()[0]
    assert header == "epoch,lr,train_images_per_s,train_loss,train_error,val_loss,top1,top5,seconds"


@pytest.mark.integration
def test_a_restarted_run_resumes_from_its_checkpoint(tmp_path, colour_image_dirs, resnet_spec):
    train, val = colour_image_dirs
    args = [
        "--train",
        str(train),
        "--validation",
        str(val),
        "--model-spec",
        str(resnet_spec),
        "--output",
        str(tmp_path / "model"),
        "--batch-size",
        "8",
        "--learning-rate",
        "0.01",
    ]
    first = run_worker(*args, "--epochs", "1")
    assert first.returncode == 0, first.stderr
    checkpoint = torch.load(tmp_path / "model" / CHECKPOINT_FILE, weights_only=True)
    assert checkpoint["epoch"] == 1 and checkpoint["config"]["params"]["epochs"] == 1

    second = run_worker(*args, "--epochs", "2")
    assert second.returncode == 0, second.stderr
    assert "resuming from" in second.stdout and "after epoch 1" in second.stdout
    metrics = json.loads((tmp_path / "model" / "metrics.json").read_text())
    assert [e["epoch"] for e in metrics["epochs"]] == [1, 2]


@pytest.mark.integration
def test_staged_weights_changed_after_the_model_stage_are_refused_by_the_worker_not_retried(
    tmp_path, colour_image_dirs
):
    train, val = colour_image_dirs
    weights = tmp_path / "resnet18.pth"
    torch.save(torchvision.models.resnet18().state_dict(), weights)
    spec_dir = write_untrained_model_directory(tmp_path / "spec", ModelSpec(pretrained=True, weights_path=str(weights)))
    with open(spec_dir / STAGED_WEIGHTS_FILE, "ab") as staged:
        staged.write(b"changed on its way to the node")
    params = TrainingParams(epochs=1, processes_per_node=2, device="cpu")
    with pytest.raises(PretrainedWeightsError) as error:
        launch_training(TrainingFolders(train, val, spec_dir, tmp_path / "model"), params, log=lambda level, line: None)
    assert str(error.value).startswith(f"{spec_dir / STAGED_WEIGHTS_FILE} has sha256 ")
    assert "the staged file changed after the model stage checked it" in str(error.value)
    assert isinstance(error.value, PipelineInputError) and not isinstance(error.value, TrainingFailedError)


@pytest.mark.integration
@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a machine without CUDA")
def test_cuda_asked_for_where_there_is_none_is_an_input_error(tmp_path, colour_image_dirs, resnet_spec):
    train, val = colour_image_dirs
    params = TrainingParams(epochs=1, processes_per_node=2, device="cuda")
    with pytest.raises(InvalidTrainingSetupError, match="device is 'cuda' but torch .* sees no CUDA device"):
        launch_training(
            TrainingFolders(train, val, resnet_spec, tmp_path / "model"), params, log=lambda level, line: None
        )


@pytest.mark.integration
def test_failing_worker_raises_typed_error_with_rank_and_log_tail(tmp_path, colour_image_dirs, resnet_spec):
    train, val = (shutil.copytree(d, tmp_path / d.name) for d in colour_image_dirs)
    spec_dir = resnet_spec
    # A runtime failure, not a mistake in what the user gave: an image damaged after conversion.
    for image in sorted(train.rglob("*.png")):
        image.write_bytes(b"damaged after conversion")
    params = TrainingParams(epochs=1, processes_per_node=2)
    logged: list[tuple[int, str]] = []
    with pytest.raises(TrainingFailedError) as error:
        folders = TrainingFolders(train, val, spec_dir, tmp_path / "model")
        launch_training(folders, params, log=lambda level, line: logged.append((level, line)))
    failure = error.value
    assert failure.returncode != 0 and failure.rank in (0, 1)
    assert "TRAINING FAILED on rank" in failure.log_tail and "Traceback" in failure.log_tail
    assert str(failure).startswith(f"training failed on rank {failure.rank} first")
    assert f"driver_log_{failure.rank}.txt" in str(failure).splitlines()[0]
    lines = [line for _, line in logged]
    assert any("torch.distributed.run" in line for line in lines)
    # Each failing rank's traceback reaches the log once at ERROR (not at INFO, nor again from stderr);
    # torchrun's own closing traceback about the same failure stays at INFO.
    failed = [line for line in lines if "TRAINING FAILED on rank" in line]
    tracebacks = [level for level, line in logged if line.startswith("Traceback (most recent call last)")]
    assert failed and tracebacks.count(logging.ERROR) == len(failed)
    assert set(tracebacks) <= {logging.ERROR, logging.INFO} and len(tracebacks) <= len(failed) + 1
