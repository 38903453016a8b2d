"""int8 on the CPU: the trained network quantized statically by ONNX Runtime (QDQ: int8 weights per channel, uint8
activations), calibrated on the version's validation images, kept beside the version as ``model.int8.onnx`` with a
record of its sha256 and of the weights it was made from, and made again when they differ.

ONNX Runtime's int8 kernels pay on an x86 CPU with AVX2 (VNNI or AMX pay more) and on an ARM CPU with the dot-product
instructions; elsewhere int8 is one warning line and the model runs in fp32. Without VNNI the weights keep 7 bits
(``reduce_range``): AVX2's multiply-add saturates 16-bit sums of full-range uint8 x int8 products. Imports no
Prefect."""

from __future__ import annotations

import json
import logging
import os
import platform
import tempfile
import warnings
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import torch

from tasks.contracts.image_directory import ImageDirectory
from tasks.contracts.image_files import IMAGE_EXTENSIONS
from tasks.contracts.image_manifest import MANIFEST_NAME
from tasks.contracts.model_directory import ModelDirectory
from tasks.errors import PipelineInputError
from tasks.inference.networks import (
    EMBEDDINGS_NAME,
    INPUT_NAME,
    LOGITS_NAME,
    OnnxNetwork,
    TorchNetwork,
    split_network,
)
from tasks.storage.local_files import atomic_write, sha256_file
from tasks.vision.images import decode_image
from tasks.vision.transforms import eval_transform

logger = logging.getLogger("tasks.inference")

INT8_FILE, INT8_RECORD = "model.int8.onnx", "model.int8.json"
CALIBRATION_IMAGES = 128
_CALIBRATION_BATCH = 16


def cpu_flags() -> set[str]:
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return set()
    return {flag for line in text.splitlines() if line.startswith(("flags", "Features")) for flag in line.split()}


def int8_unavailable(flags: set[str] | None = None, machine: str | None = None) -> str | None:
    """Why int8 would not pay on this CPU, in words; None when it does."""
    flags, machine = cpu_flags() if flags is None else flags, (machine or platform.machine()).lower()
    if machine in {"x86_64", "amd64"}:
        return None if "avx2" in flags else "this x86 CPU has no AVX2, which ONNX Runtime's int8 kernels need"
    if machine in {"aarch64", "arm64"}:
        return None if "asimddp" in flags else "this ARM CPU has no dot-product instructions (asimddp)"
    return f"ONNX Runtime has no int8 kernels that pay on {machine}"


def has_vnni(flags: set[str] | None = None) -> bool:
    flags = cpu_flags() if flags is None else flags
    return bool(flags & {"avx512_vnni", "avx_vnni", "amx_int8"})


def calibration_images(location: str | os.PathLike[str] | ImageDirectory) -> list[Path]:
    """The images of an ImageDirectory, or of any folder (its image files, in sorted order)."""
    if isinstance(location, ImageDirectory) or (Path(location) / MANIFEST_NAME).is_file():
        images = location if isinstance(location, ImageDirectory) else ImageDirectory(location)
        return [Path(path) for path, _ in images.samples()]
    found = sorted(path for path in Path(location).rglob("*") if path.suffix.lower() in IMAGE_EXTENSIONS)
    if not found:
        raise PipelineInputError(f"calibration {os.fspath(location)!r} holds no images: give the validation images")
    return found


def calibration_batches(model_dir: ModelDirectory, paths: list[Path], count: int) -> Iterator[np.ndarray]:
    """Up to ``count`` of ``paths``, spread over the whole list, normalised as the model takes them."""
    spec = model_dir.spec
    transform = eval_transform(spec.transformations, spec.image_size, spec.mean, spec.std)
    chosen = np.linspace(0, len(paths) - 1, num=min(count, len(paths)), dtype=int)
    for start in range(0, len(chosen), _CALIBRATION_BATCH):
        batch = torch.stack([decode_image(paths[i], transform) for i in chosen[start : start + _CALIBRATION_BATCH]])
        yield transform.normalize(batch).numpy()


def export_split(model_dir: ModelDirectory, path: Path) -> None:
    """The fp32 graph quantization starts from: images in, logits and embeddings out, any batch size."""
    side = model_dir.spec.transformations.decoded_side(model_dir.spec.image_size)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the TorchScript-based exporter's deprecation notices
        torch.onnx.export(
            split_network(model_dir, torch.device("cpu")),
            (torch.zeros(2, 3, side, side),),
            str(path),
            dynamo=False,
            input_names=[INPUT_NAME],
            output_names=[LOGITS_NAME, EMBEDDINGS_NAME],
            opset_version=17,
            dynamic_axes={name: {0: "batch"} for name in (INPUT_NAME, LOGITS_NAME, EMBEDDINGS_NAME)},
        )


def quantize(model_dir: ModelDirectory, calibration: list[Path], target: Path) -> None:
    from onnxruntime.quantization import CalibrationDataReader, QuantFormat, QuantType, quantize_static
    from onnxruntime.quantization.shape_inference import quant_pre_process

    class Reader(CalibrationDataReader):
        def __init__(self) -> None:
            self.batches = calibration_batches(model_dir, calibration, CALIBRATION_IMAGES)

        def get_next(self) -> dict[str, np.ndarray] | None:
            batch = next(self.batches, None)
            return None if batch is None else {INPUT_NAME: batch}

    with tempfile.TemporaryDirectory(prefix="int8-") as scratch:
        fp32, prepared = Path(scratch) / "fp32.onnx", Path(scratch) / "prepared.onnx"
        export_split(model_dir, fp32)
        quant_pre_process(str(fp32), str(prepared), skip_symbolic_shape=True)
        quantize_static(
            str(prepared),
            str(target),
            Reader(),
            quant_format=QuantFormat.QDQ,
            activation_type=QuantType.QUInt8,
            weight_type=QuantType.QInt8,
            per_channel=True,
            reduce_range=not has_vnni(),
        )


def int8_model(model_dir: ModelDirectory, calibration: str | os.PathLike[str] | ImageDirectory | None = None) -> Path:
    """``model.int8.onnx`` beside the model: the one there when its record names these weights and its sha256
    matches, else made now from ``calibration`` (the version's validation ImageDirectory)."""
    path, record_path = model_dir.root / INT8_FILE, model_dir.root / INT8_RECORD
    weights = sha256_file(model_dir.weights_path)
    try:
        record = json.loads(record_path.read_text())
        if record["weights_sha256"] == weights and path.is_file() and sha256_file(path) == record["sha256"]:
            return path
    except (OSError, ValueError, KeyError):
        pass
    if calibration is None:
        raise PipelineInputError(
            f"precision 'int8' quantizes {model_dir.root} the first time, calibrated on its validation images: give "
            "calibration (--calibration DIR: the validation ImageDirectory, or a folder of them)"
        )
    images = calibration_images(calibration)
    source = str(calibration.root if isinstance(calibration, ImageDirectory) else calibration)
    with tempfile.TemporaryDirectory(prefix="int8-", dir=model_dir.root) as scratch:
        made = Path(scratch) / INT8_FILE
        quantize(model_dir, images, made)
        made.replace(path)
    digest = sha256_file(path)
    with atomic_write(record_path, "w") as handle:
        json.dump(
            {
                "sha256": digest,
                "weights_sha256": weights,
                "calibration": {"source": source, "images": min(CALIBRATION_IMAGES, len(images))},
                "reduce_range": not has_vnni(),
            },
            handle,
            indent=2,
        )
    logger.info(
        "int8 model made: %s (calibrated on %d images of %s)", path, min(CALIBRATION_IMAGES, len(images)), source
    )
    return path


def int8_network(
    model_dir: ModelDirectory,
    threads: int | None = None,
    calibration: str | os.PathLike[str] | ImageDirectory | None = None,
) -> tuple[OnnxNetwork | TorchNetwork, str]:
    """The int8 network and "int8", or, on a CPU where int8 does not pay, one warning line and the fp32 network."""
    reason = int8_unavailable()
    if reason is not None:
        logger.warning("precision int8 asked, fp32 used: %s", reason)
        side = model_dir.spec.transformations.decoded_side(model_dir.spec.image_size)
        return TorchNetwork(model_dir, torch.device("cpu"), side), "fp32"
    return OnnxNetwork(int8_model(model_dir, calibration), threads), "int8"
