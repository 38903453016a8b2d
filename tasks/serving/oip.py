"""The Open Inference Protocol's REST inference request and response (KServe's V2, Triton's HTTP API), for an
image classifier: one BYTES input of encoded images in, a ``label`` (BYTES) and a ``probabilities`` (FP32,
N x classes) output out.

Both of the protocol's encodings are taken and given: JSON ``data`` (a BYTES element is the image base64-encoded,
as JSON holds no raw bytes), and Triton's binary tensor extension (``Inference-Header-Content-Length``: the JSON
header, then each binary tensor; a BYTES tensor's elements each a 4-byte little-endian length and the bytes), which
tritonclient uses unchanged. Plain functions on bytes and dicts: no HTTP framework here.
"""

from __future__ import annotations

import base64
import binascii
import json
import struct
from dataclasses import dataclass
from typing import Any

import numpy as np

INPUT_NAME = "image"
LABEL_OUTPUT, PROBABILITIES_OUTPUT = "label", "probabilities"
HEADER_LENGTH = "Inference-Header-Content-Length"


class InferRequestError(ValueError):
    """A request this endpoint cannot read: told to the client as 400 with the reason."""


@dataclass
class InferRequest:
    id: str | None
    images: list[bytes]
    binary_outputs: dict[str, bool]  # output name -> send it as binary data


def _bytes_elements(data: bytes, where: str) -> list[bytes]:
    """A binary BYTES tensor's elements: each a little-endian uint32 length, then that many bytes."""
    elements, offset = [], 0
    while offset < len(data):
        if offset + 4 > len(data):
            raise InferRequestError(f"{where}: a BYTES element's 4-byte length is cut off at byte {offset}")
        (size,) = struct.unpack_from("<I", data, offset)
        offset += 4
        if offset + size > len(data):
            raise InferRequestError(f"{where}: an element of {size} bytes runs past the tensor's end")
        elements.append(data[offset : offset + size])
        offset += size
    return elements


def _json_elements(data: Any, where: str) -> list[bytes]:
    flat = list(np.asarray(data, dtype=object).reshape(-1)) if isinstance(data, list) else None
    if not flat or not all(isinstance(item, str) for item in flat):
        raise InferRequestError(f"{where}: 'data' must be a list of base64 strings (the encoded images)")
    try:
        return [base64.b64decode(item, validate=True) for item in flat]
    except binascii.Error as error:
        raise InferRequestError(f"{where}: an element is not base64 ({error})") from None


def parse_infer_request(body: bytes, header_length: str | None) -> InferRequest:
    """The images of a request body (JSON, or JSON and binary tensors when ``header_length`` is given)."""
    try:
        size = len(body) if header_length is None else int(header_length)
    except ValueError:
        raise InferRequestError(f"{HEADER_LENGTH} {header_length!r} is not a number of bytes") from None
    if not 0 < size <= len(body):
        raise InferRequestError(f"{HEADER_LENGTH} {size} does not fit a body of {len(body)} bytes")
    try:
        request = json.loads(body[:size])
    except (ValueError, UnicodeDecodeError) as error:
        raise InferRequestError(f"the inference request is not JSON ({error})") from None
    inputs = request.get("inputs") if isinstance(request, dict) else None
    if not isinstance(inputs, list) or len(inputs) != 1 or not isinstance(inputs[0], dict):
        raise InferRequestError(f"give exactly one input, a BYTES tensor named {INPUT_NAME!r} of encoded images")
    tensor = inputs[0]
    where = f"input {tensor.get('name')!r}"
    if tensor.get("datatype") != "BYTES":
        raise InferRequestError(f"{where}: datatype {tensor.get('datatype')!r}, expected 'BYTES' (encoded images)")
    binary_size = (tensor.get("parameters") or {}).get("binary_data_size")
    if binary_size is not None:
        binary = body[size:]
        if not isinstance(binary_size, int) or binary_size > len(binary):
            raise InferRequestError(f"{where}: binary_data_size {binary_size!r}, the body holds {len(binary)}")
        images = _bytes_elements(binary[:binary_size], where)
    else:
        images = _json_elements(tensor.get("data"), where)
    shape = tensor.get("shape")
    if not isinstance(shape, list) or int(np.prod(shape or [0])) != len(images):
        raise InferRequestError(f"{where}: shape {shape!r} does not hold its {len(images)} elements")
    everything_binary = bool((request.get("parameters") or {}).get("binary_data_output", False))
    wanted = request.get("outputs") or [{"name": LABEL_OUTPUT}, {"name": PROBABILITIES_OUTPUT}]
    outputs = {}
    for output in wanted:
        name = output.get("name") if isinstance(output, dict) else None
        if name not in (LABEL_OUTPUT, PROBABILITIES_OUTPUT):
            raise InferRequestError(f"output {name!r} unknown: outputs are {LABEL_OUTPUT!r}, {PROBABILITIES_OUTPUT!r}")
        outputs[name] = bool((output.get("parameters") or {}).get("binary_data", everything_binary))
    request_id = request.get("id")
    return InferRequest(request_id if isinstance(request_id, str) else None, images, outputs)


def infer_response(
    request: InferRequest, model_name: str, model_version: str, labels: list[str], probabilities: np.ndarray
) -> tuple[bytes, dict[str, str]]:
    """The response body and its headers."""
    tensors = {
        LABEL_OUTPUT: ("BYTES", [len(labels)], labels),
        PROBABILITIES_OUTPUT: ("FP32", list(probabilities.shape), probabilities.astype("<f4")),
    }
    outputs, binary = [], []
    for name, as_binary in request.binary_outputs.items():
        datatype, shape, values = tensors[name]
        output: dict[str, Any] = {"name": name, "datatype": datatype, "shape": shape}
        if as_binary:
            if datatype == "BYTES":
                data = b"".join(struct.pack("<I", len(v.encode())) + v.encode() for v in values)
            else:
                data = values.tobytes()
            output["parameters"] = {"binary_data_size": len(data)}
            binary.append(data)
        else:
            output["data"] = list(values) if datatype == "BYTES" else values.reshape(-1).tolist()
        outputs.append(output)
    response: dict[str, Any] = {"model_name": model_name, "model_version": model_version, "outputs": outputs}
    if request.id is not None:
        response["id"] = request.id
    header = json.dumps(response).encode()
    if not binary:
        return header, {"Content-Type": "application/json"}
    return header + b"".join(binary), {"Content-Type": "application/octet-stream", HEADER_LENGTH: str(len(header))}


def model_metadata(name: str, versions: list[str], platform: str, classes: int) -> dict[str, Any]:
    return {
        "name": name,
        "versions": versions,
        "platform": platform,
        "inputs": [{"name": INPUT_NAME, "datatype": "BYTES", "shape": [-1]}],
        "outputs": [
            {"name": LABEL_OUTPUT, "datatype": "BYTES", "shape": [-1]},
            {"name": PROBABILITIES_OUTPUT, "datatype": "FP32", "shape": [-1, classes]},
        ],
    }
