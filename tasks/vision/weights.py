"""Pretrained weights for a ModelSpec: resolved in one place, always checked against their expected sha256.

Where the file comes from, in this order:

1. ``weights_path`` when it is a local file (the user's own);
2. torch's cache, ``torch.hub.get_dir()/checkpoints/<file name>`` (``$TORCH_HOME/hub``), shared with torch.hub:
   one download per host;
3. the mirror ``$IMAGE_CLASSIFIER_WEIGHTS_MIRROR`` (an HTTP(S) base URL or ``s3://bucket/prefix``) + the file
   name, for sites that cannot reach the internet;
4. the file's own location: torchvision's URL (``get_model_weights(arch).DEFAULT.url``), or weights_path's
   https:// URL or s3:// URI.

The expected hash is ``weights_sha256`` (64 hex digits) or the prefix in a torch.hub-style file name
``name-<hex>.pth`` (what torch.hub's check_hash reads; every torchvision file has one). A download lands in a
temporary folder beside the cache and is moved in only once its hash matches: a wrong file is refused, never
loaded and never cached. The model stage (``tasks.model.prefect_tasks``) resolves the weights once, in the flow's process, and
stages the checked file in the UntrainedModelDirectory; training nodes load that copy (``staged_weights``) and
never download.
"""

from __future__ import annotations

import contextlib
import http.client
import logging
import os
import re
import tempfile
import urllib.error
import urllib.parse
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

import torch
import torchvision
from torch import nn

from tasks.contracts.model_directory import (
    SPEC_FILE,
    STAGED_WEIGHTS_FILE,
    WARM_START_FILE,
    ModelSpec,
    PretrainedWeights,
)
from tasks.errors import InvalidModelDirectoryError, PretrainedWeightsError, PretrainedWeightsUnavailableError
from tasks.progress import every_while, run_logger
from tasks.storage.local_files import sha256_file
from tasks.storage.s3 import download_s3_object, is_s3_uri, parse_s3_uri, s3_client

MIRROR_VARIABLE = "IMAGE_CLASSIFIER_WEIGHTS_MIRROR"
# torch.hub's file-name convention (its HASH_REGEX), read strictly: 8 or more hex digits just before the extension.
_HASH_IN_NAME = re.compile(r"-([0-9a-f]{8,64})\.[A-Za-z0-9]+$")
# torchvision's published DenseNet files predate its layer names ("norm.1" is now "norm1"); no other key matches.
_OLD_DENSENET_KEY = re.compile(
    r"^(.*denselayer\d+\.(?:norm|relu|conv))\.((?:[12])\.(?:weight|bias|running_mean|running_var|num_batches_tracked))$"
)
logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class ResolvedWeights:
    path: Path  # a local file whose hash was checked
    origin: PretrainedWeights


@dataclass(frozen=True)
class WantedWeights:
    """The file a spec asks for: its name, where it is published and the hash (or hash prefix) it must have."""

    architecture: str
    name: str
    location: str  # torchvision's URL, weights_path's URL or s3:// URI, or a local path
    expected: str | None  # the full sha256 or a prefix of it; None only for the user's own local file

    @property
    def remote(self) -> bool:
        return is_s3_uri(self.location) or self.location.startswith(("http://", "https://"))

    def accepts(self, digest: str) -> bool:
        return digest.startswith(self.expected or "")

    @property
    def cache_path(self) -> Path:
        """Every cached file carries its hash in its name, so two sources' same-named files never collide."""
        name = PurePosixPath(self.name)
        if not _HASH_IN_NAME.search(self.name):
            name = name.with_name(f"{name.stem}-{self.expected[:8]}{name.suffix}")
        return Path(torch.hub.get_dir()) / "checkpoints" / name.name


def wanted_weights(spec: ModelSpec) -> WantedWeights:
    if spec.weights_path:
        location = spec.weights_path
        name = PurePosixPath(urllib.parse.urlparse(location).path).name if "://" in location else Path(location).name
    else:
        try:
            location = torchvision.models.get_model_weights(spec.architecture).DEFAULT.url
        except (ValueError, KeyError, AttributeError):
            raise PretrainedWeightsError(
                f"torchvision publishes no pretrained weights for {spec.architecture}: set weights_path to a "
                "state dict of your own, or set pretrained to false"
            ) from None
        name = location.rsplit("/", 1)[-1]
    match = _HASH_IN_NAME.search(name)
    if spec.weights_sha256 and match and not spec.weights_sha256.startswith(match.group(1)):
        raise PretrainedWeightsError(
            f"weights_sha256 {spec.weights_sha256} does not start with {match.group(1)}, the hash in the file name "
            f"{name}: one of the two is wrong"
        )
    wanted = WantedWeights(spec.architecture, name, location, spec.weights_sha256 or (match and match.group(1)))
    if wanted.remote and wanted.expected is None:
        raise PretrainedWeightsError(
            f"weights_path {location} comes with no expected hash, and a file fetched from elsewhere is loaded only "
            f"once its hash is checked: set weights_sha256 to its sha256 (64 hex digits, `sha256sum {name}`), or "
            "publish it under a torch.hub-style name, <name>-<first 8 or more hex digits of its sha256>.pth"
        )
    return wanted


def _checked(wanted: WantedWeights, path: Path, source: str, remedy: str) -> PretrainedWeights:
    digest = sha256_file(path)
    if not wanted.accepts(digest):
        raise PretrainedWeightsError(
            f"{source} has sha256 {digest}, but the {wanted.architecture} weights {wanted.name} must have "
            f"{wanted.expected}{'…' if len(wanted.expected) < 64 else ''}: refused, not loaded. {remedy}"
        )
    return PretrainedWeights(name=wanted.name, sha256=digest, source=source)


def _sources(wanted: WantedWeights) -> list[str]:
    mirror = os.environ.get(MIRROR_VARIABLE, "").strip().rstrip("/")
    if mirror and not (is_s3_uri(mirror) or mirror.startswith(("http://", "https://"))):
        raise PretrainedWeightsError(
            f"{MIRROR_VARIABLE}={mirror!r} is neither an http(s):// base URL nor an s3://bucket/prefix"
        )
    return ([f"{mirror}/{wanted.name}"] if mirror else []) + [wanted.location]


@contextlib.contextmanager
def report_progress(folder: Path, what: str, every: float | None = None) -> Iterator[None]:
    """While the block runs, log ``what`` and the bytes written below ``folder`` so far, every ``every`` seconds
    (default PROGRESS_SECONDS); the downloaders write their partial files there."""

    def line() -> str:
        return f"{what}: {sum(f.stat().st_size for f in folder.rglob('*') if f.is_file()) / 1e6:.1f} MB so far"

    with every_while(line, run_logger(logger), every):
        yield


def _download(wanted: WantedWeights, source: str, cached: Path) -> PretrainedWeights:
    cached.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=cached.parent, prefix=".download-") as folder:
        temporary = Path(folder) / wanted.name
        logger.info("fetching %s", source)
        with report_progress(Path(folder), f"fetching {wanted.name}"):
            if is_s3_uri(source):
                where = parse_s3_uri(source)
                download_s3_object(s3_client(max_attempts=3), where.bucket, where.prefix, temporary)
            else:
                torch.hub.download_url_to_file(source, str(temporary), progress=False)
        origin = _checked(
            wanted, temporary, source, f"Nothing was cached: replace the file at {source} with the published one."
        )
        os.replace(temporary, cached)
    return origin


def _unreachable_errors() -> tuple[type[BaseException], ...]:
    from botocore.exceptions import BotoCoreError, ClientError

    # OSError covers urllib's URLError and HTTPError, refused and reset connections and timeouts.
    return (OSError, http.client.HTTPException, BotoCoreError, ClientError)


def _reason(error: BaseException) -> str:
    if isinstance(error, urllib.error.HTTPError):
        return f"HTTP {error.code} {error.reason}"
    if isinstance(error, urllib.error.URLError):
        return str(error.reason)
    return str(error) or type(error).__name__


def resolve_weights(spec: ModelSpec) -> ResolvedWeights:
    """A local file holding ``spec``'s pretrained weights, its hash checked, and where it came from."""
    wanted = wanted_weights(spec)
    if not wanted.remote:
        path = Path(wanted.location)
        if not path.is_file():
            raise PretrainedWeightsError(f"weights_path {path} for {spec.architecture} does not exist")
        return ResolvedWeights(path, _checked(wanted, path, str(path), "Check the file and weights_sha256."))
    cached = wanted.cache_path
    if cached.is_file():
        remedy = "It was not put there by this pipeline, which caches only checked files: delete it."
        return ResolvedWeights(cached, _checked(wanted, cached, str(cached), remedy))
    failures = []
    for source in _sources(wanted):
        try:
            return ResolvedWeights(cached, _download(wanted, source, cached))
        except _unreachable_errors() as error:
            failures.append(f"{source}: {_reason(error)}")
    raise PretrainedWeightsUnavailableError(
        f"pretrained {spec.architecture} needs the weights file {wanted.name}, which is not in this host's torch "
        f"cache and could not be fetched ({'; '.join(failures)}). Provide it in one of three ways: "
        f"(1) let this host reach {wanted.location} (the file is then cached at {cached} and not fetched again); "
        f"(2) set {MIRROR_VARIABLE} to an HTTP(S) base URL or an s3://bucket/prefix that holds {wanted.name}; "
        f"(3) copy the file to {cached}, or set weights_path to a local copy. "
        "Or set pretrained to false to train from scratch."
    )


def _unchanged(path: Path, recorded: PretrainedWeights) -> Path:
    """``path``, a staged copy, once its sha256 is the one the model stage recorded; refused, never loaded, if not."""
    digest = sha256_file(path)
    if digest != recorded.sha256:
        raise PretrainedWeightsError(
            f"{path} has sha256 {digest}, but {SPEC_FILE} records {recorded.name} with sha256 "
            f"{recorded.sha256}: the staged file changed after the model stage checked it; refused, not loaded"
        )
    return path


def staged_weights(spec_dir: str | os.PathLike[str], spec: ModelSpec) -> Path | None:
    """The weights file the model stage staged in an UntrainedModelDirectory, checked against the sha256 it
    recorded; None when the spec is not pretrained. What a training node loads: it never downloads."""
    if not spec.pretrained:
        return None
    path = Path(spec_dir) / STAGED_WEIGHTS_FILE
    if spec.weights is None or not path.is_file():
        raise PretrainedWeightsError(
            f"{spec_dir} asks for pretrained weights but holds no {STAGED_WEIGHTS_FILE} with its origin recorded "
            f"in {SPEC_FILE}: write it with the model stage (tasks.model.untrained.write_untrained_model_directory), which "
            "checks the weights and stages them for every training node"
        )
    return _unchanged(path, spec.weights)


def staged_warm_start(spec_dir: str | os.PathLike[str], spec: ModelSpec) -> Path | None:
    """A warm start's weights (a registered version's, head included: tasks/model/warm_start.py) that the model stage
    staged, checked against the sha256 it recorded; None without a warm start. What a training node loads once the
    head is built."""
    if spec.started_from is None:
        return None
    path = Path(spec_dir) / WARM_START_FILE
    if not path.is_file():
        raise PretrainedWeightsError(
            f"{spec_dir}/{SPEC_FILE} starts from {spec.started_from.name}, but {WARM_START_FILE} is not beside it: "
            "write the folder with the model stage (tasks.model.untrained.write_untrained_model_directory)"
        )
    return _unchanged(path, spec.started_from)


def load_weights(model: nn.Module, path: Path, architecture: str) -> None:
    """Load a state dict file into ``model`` (tensors only: ``weights_only``)."""
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as error:
        raise InvalidModelDirectoryError(f"{path} is not a readable PyTorch state dict: {error}") from error
    if not isinstance(state, dict):
        raise InvalidModelDirectoryError(f"{path} holds a {type(state).__name__}, not a PyTorch state dict")
    state = {_OLD_DENSENET_KEY.sub(r"\1\2", key): value for key, value in state.items()}
    try:
        model.load_state_dict(state)
    except RuntimeError as error:
        detail = str(error) if len(str(error)) < 600 else str(error)[:600] + " …"
        raise InvalidModelDirectoryError(f"the weights in {path} do not fit {architecture}: {detail}") from error
