"""Pretrained weights: torch's cache, a mirror (HTTP on loopback, S3 on moto), weights_path URLs, the hash check,
the offline error and the copy staged for training nodes.

Every test points the https proxy at a closed loopback port, so torchvision's own URL is unreachable whether or not
the machine has internet: real ImageNet files are never fetched. Positive tests use files of their own with their
real sha256; torchvision's names appear where a file must be refused.
"""

import hashlib
import shutil
from pathlib import Path

import pytest
import torch
import torchvision
from prefect import flow

from deployments.local import free_port
from flows.pipeline import train_pipeline
from tasks.contracts.model_directory import (
    SPEC_FILE,
    STAGED_WEIGHTS_FILE,
    ModelSpec,
    PretrainedWeights,
    TrainedModelSpec,
    read_model_spec,
)
from tasks.errors import PipelineInputError, PretrainedWeightsError, PretrainedWeightsUnavailableError
from tasks.model.untrained import write_untrained_model_directory
from tasks.registry.card import model_card_markdown
from tasks.registry.manage import model_versions
from tasks.registry.prefect_tasks import register
from tasks.storage.local_files import sha256_file
from tasks.storage.s3 import s3_client
from tasks.vision.networks import build_network
from tasks.vision.weights import MIRROR_VARIABLE, resolve_weights, staged_weights
from tests.helpers import write_class_folders

TORCHVISION_RESNET18 = "https://download.pytorch.org/models/resnet18-f37072fd.pth"
CONTENT = b"not really weights, but bytes with a real sha256" * 100
SHA256 = hashlib.sha256(CONTENT).hexdigest()
HASHED_NAME = f"mine-{SHA256[:8]}.pth"


def test_weights_come_through_the_mirror_once_then_from_torchs_cache(server, torch_home, monkeypatch):
    server.files[f"/mirror/{HASHED_NAME}"] = CONTENT
    monkeypatch.setenv(MIRROR_VARIABLE, f"{server.url}/mirror/")
    spec = ModelSpec(pretrained=True, weights_path=f"https://weights.example.com/models/{HASHED_NAME}")

    first = resolve_weights(spec)
    assert first.path == torch_home / HASHED_NAME and first.path.read_bytes() == CONTENT
    assert first.origin == PretrainedWeights(
        name=HASHED_NAME, sha256=SHA256, source=f"{server.url}/mirror/{HASHED_NAME}"
    )
    second = resolve_weights(spec)
    assert server.requests == [f"/mirror/{HASHED_NAME}"], "the second resolution asks no one"
    assert second.path == first.path and second.origin.source == str(torch_home / HASHED_NAME)
    assert sorted(p.name for p in torch_home.iterdir()) == [HASHED_NAME], "no temporary file is left behind"


def test_a_weights_url_with_its_sha256_is_fetched_and_cached_under_a_hashed_name(server, torch_home):
    server.files["/files/weights.pth"] = CONTENT
    url = f"{server.url}/files/weights.pth"
    resolved = resolve_weights(ModelSpec(pretrained=True, weights_path=url, weights_sha256=SHA256))
    assert resolved.path == torch_home / f"weights-{SHA256[:8]}.pth"
    assert resolved.origin == PretrainedWeights(name="weights.pth", sha256=SHA256, source=url)

    with pytest.raises(PretrainedWeightsError, match="set weights_sha256 to its sha256"):
        resolve_weights(ModelSpec(pretrained=True, weights_path=url))
    with pytest.raises(PretrainedWeightsError, match=f"does not start with {SHA256[:8]}, the hash in the file name"):
        resolve_weights(ModelSpec(weights_path=f"{server.url}/{HASHED_NAME}", weights_sha256="0" * 64))
    assert server.requests == ["/files/weights.pth"]


def test_a_file_whose_hash_differs_is_refused_and_never_cached(server, torch_home, monkeypatch):
    # Served under torchvision's real name: the name's hash prefix, f37072fd, is what the bytes must match.
    server.files["/resnet18-f37072fd.pth"] = CONTENT
    monkeypatch.setenv(MIRROR_VARIABLE, server.url)
    with pytest.raises(PretrainedWeightsError, match=f"has sha256 {SHA256}, .* must have f37072fd…: refused") as error:
        resolve_weights(ModelSpec(pretrained=True))
    assert not isinstance(error.value, PretrainedWeightsUnavailableError)
    assert list(torch_home.iterdir()) == []

    (torch_home / "resnet18-f37072fd.pth").write_bytes(CONTENT)  # put there by hand
    with pytest.raises(PretrainedWeightsError, match="caches only checked files: delete it"):
        resolve_weights(ModelSpec(pretrained=True))
    assert server.requests == ["/resnet18-f37072fd.pth"]


def test_offline_with_nothing_cached_is_one_error_naming_the_three_ways(torch_home, monkeypatch):
    monkeypatch.setenv(MIRROR_VARIABLE, f"http://127.0.0.1:{free_port()}/weights")
    with pytest.raises(PretrainedWeightsUnavailableError) as error:
        resolve_weights(ModelSpec(architecture="resnet18", pretrained=True))
    message, cached = str(error.value), torch_home / "resnet18-f37072fd.pth"
    assert f"(1) let this host reach {TORCHVISION_RESNET18} (the file is then cached at {cached}" in message
    assert (
        f"(2) set {MIRROR_VARIABLE} to an HTTP(S) base URL or an s3://bucket/prefix that holds resnet18-f37" in message
    )
    assert f"(3) copy the file to {cached}, or set weights_path to a local copy" in message
    assert "/weights/resnet18-f37072fd.pth: [Errno 111] Connection refused" in message
    assert isinstance(error.value, PipelineInputError) and error.value.__context__ is None
    assert "\n" not in message


@pytest.mark.integration
def test_weights_from_s3_as_weights_path_and_as_the_mirror(s3_bucket, torch_home, monkeypatch):
    s3_client().put_object(Bucket=s3_bucket, Key=f"team/weights/{HASHED_NAME}", Body=CONTENT)
    uri = f"s3://{s3_bucket}/team/weights/{HASHED_NAME}"
    assert resolve_weights(ModelSpec(pretrained=True, weights_path=uri)).origin.source == uri

    (torch_home / HASHED_NAME).unlink()
    monkeypatch.setenv(MIRROR_VARIABLE, f"s3://{s3_bucket}/team/weights")
    resolved = resolve_weights(ModelSpec(pretrained=True, weights_path=f"https://elsewhere.example.com/{HASHED_NAME}"))
    assert resolved.origin.source == uri and sha256_file(resolved.path) == SHA256


@pytest.fixture(scope="module")
def imagenet_like(tmp_path_factory) -> tuple[Path, torch.nn.Module]:
    """A resnet18 state dict of our own, in the shape of torchvision's ImageNet file (1000 classes)."""
    torch.manual_seed(3)
    network = torchvision.models.resnet18()
    path = tmp_path_factory.mktemp("weights") / "resnet18-imagenet.pth"
    torch.save(network.state_dict(), path)
    return path, network


def test_the_untrained_directory_stages_the_checked_weights_and_the_worker_checks_them(
    server, torch_home, imagenet_like, tmp_path
):
    path, imagenet = imagenet_like
    digest = sha256_file(path)
    server.files["/resnet18-imagenet.pth"] = path.read_bytes()
    spec = ModelSpec(pretrained=True, weights_path=f"{server.url}/resnet18-imagenet.pth", weights_sha256=digest)

    root = write_untrained_model_directory(tmp_path / "model_spec", spec)
    written = read_model_spec(root)
    assert written.weights == PretrainedWeights(name="resnet18-imagenet.pth", sha256=digest, source=spec.weights_path)
    assert sha256_file(root / STAGED_WEIGHTS_FILE) == digest
    network = build_network(written, 4, staged_weights(root, written))
    assert torch.equal(network.conv1.weight, imagenet.conv1.weight) and network.fc.out_features == 4

    with open(root / STAGED_WEIGHTS_FILE, "r+b") as staged:
        staged.seek(-1, 2)
        staged.write(b"\0" if staged.read(1) != b"\0" else b"\1")
    with pytest.raises(PretrainedWeightsError, match="the staged file changed after the model stage checked it"):
        staged_weights(root, written)
    (root / STAGED_WEIGHTS_FILE).unlink()
    with pytest.raises(PretrainedWeightsError, match=f"holds no {STAGED_WEIGHTS_FILE}"):
        staged_weights(root, written)


def test_a_local_weights_file_without_a_hash_is_the_users_own_and_is_recorded(imagenet_like, tmp_path):
    path, _ = imagenet_like
    root = write_untrained_model_directory(tmp_path / "model_spec", ModelSpec(pretrained=True, weights_path=str(path)))
    assert read_model_spec(root).weights == PretrainedWeights(
        name=path.name, sha256=sha256_file(path), source=str(path)
    )
    with pytest.raises(PretrainedWeightsError, match="Check the file and weights_sha256"):
        resolve_weights(ModelSpec(pretrained=True, weights_path=str(path), weights_sha256="0" * 64))
    scratch = write_untrained_model_directory(tmp_path / "model_spec", ModelSpec(pretrained=False))
    assert read_model_spec(scratch).weights is None and not (scratch / STAGED_WEIGHTS_FILE).exists()


def test_an_offline_host_fails_the_flow_on_the_weights_before_any_conversion(prefect_server, torch_home, tmp_path):
    train, val = write_class_folders(tmp_path / "train", 2), write_class_folders(tmp_path / "val", 2, seed=1)
    with pytest.raises(PretrainedWeightsUnavailableError, match="Provide it in one of three ways"):
        train_pipeline(train_data=str(train), validation_data=str(val), work_dir=str(tmp_path / "runs"))
    assert not list(tmp_path.glob("runs/*/data")), "nothing was converted"


def test_the_registration_and_the_model_card_show_the_weights(prefect_server, trained_model, tmp_path):
    model_dir = shutil.copytree(trained_model, tmp_path / "model")
    origin = PretrainedWeights(name="resnet18-f37072fd.pth", sha256="f37072fd" + "0" * 56, source=TORCHVISION_RESNET18)
    spec = TrainedModelSpec.model_validate_json((model_dir / SPEC_FILE).read_text())
    (model_dir / SPEC_FILE).write_text(
        spec.model_copy(update={"pretrained": True, "weights": origin}).model_dump_json()
    )

    @flow(name="register-pretrained")
    def register_once():
        return register(str(tmp_path / "registry"), "colours", str(model_dir), {}, {}, {"model": {}})

    registered = register_once()
    assert registered.registration.params["pretrained_weights"] == origin.model_dump()
    card, _ = model_card_markdown("colours", "registry", model_versions(str(tmp_path / "registry"), "colours"), None)
    assert "\n- pretrained weights: resnet18-f37072fd.pth `f37072fd0000`\n" in card.split("#### Details")[1]


def test_a_download_reports_its_progress_while_it_runs(tmp_path, caplog):
    import logging
    import threading

    from tasks.vision.weights import report_progress

    reported = threading.Event()

    class Seen(logging.Handler):
        def emit(self, record):
            if "2.0 MB so far" in record.getMessage():  # once the file is written
                reported.set()

    seen = Seen()
    logging.getLogger("tasks.vision.weights").addHandler(seen)
    caplog.set_level(logging.INFO, logger="tasks.vision.weights")
    try:
        with report_progress(tmp_path, "fetching w.pth", every=0.01):
            (tmp_path / "w.pth.partial").write_bytes(b"x" * 2_000_000)
            assert reported.wait(60), "a progress line while the download runs"
    finally:
        logging.getLogger("tasks.vision.weights").removeHandler(seen)
    assert "fetching w.pth: 2.0 MB so far" in caplog.text
