"""The Open Inference Protocol's REST inference request and response (KServe's V2, Triton's HTTP API), for an
image classifier: one BYTES input of encoded images in, a ``label`` (BYTES) and a ``probabilities`` (FP32,
N x classes) output out.

Both of the protocol's encodings are taken and given: JSON ``data`` (a BYTES element is the image base64-encoded,
as JSON holds no raw bytes), and Triton's binary tensor extension (``Inference-Header-Content-Length``: the JSON
header, then each binary tensor; a BYTES tensor's elements each a 4-byte little-endian length and the bytes), which
tritonclient uses unchanged. A request's images are counted before any is built: its JSON as it arrives
(``JsonCount``), then the shape. Plain functions on bytes and dicts: no HTTP framework here.
"""

from __future__ import annotations

import base64
import binascii
import json
import math
import struct
from dataclasses import dataclass
from typing import Any

import numpy as np

INPUT_NAME = "image"
LABEL_OUTPUT, PROBABILITIES_OUTPUT = "label", "probabilities"
HEADER_LENGTH = "Inference-Header-Content-Length"


class InferRequestError(ValueError):
    """A request this endpoint cannot read: told to the client with ``status`` (400, or 413 for more images than
    are ever admitted at once) and the reason."""

    def __init__(self, message: str, status: int = 400) -> None:
        super().__init__(message)
        self.status = status


@dataclass
class InferRequest:
    id: str | None
    images: list[bytes]
    binary_outputs: dict[str, bool]  # output name -> send it as binary data


# Besides one value per image, a request holds a few dozen: its input's name, datatype and shape, the outputs
# asked for, parameters. A request past this many more is refused before it is parsed.
OTHER_VALUES = 256
# base64 text decoded this many characters at a time (a whole number of 4-character groups): each piece holds
# Python's lock a few milliseconds, so a large element never holds the event loop for long.
BASE64_PIECE = 2**20


def _shown(value: Any, most: int = 60) -> str:
    text = repr(value)
    return text if len(text) <= most else f"{text[: most - 1]}…"


def json_size(header: str | None) -> int | None:
    """The JSON part's length in bytes from ``Inference-Header-Content-Length`` (None: the whole body is JSON)."""
    if header is None:
        return None
    if not header.isdigit() or int(header) == 0:
        raise InferRequestError(f"{HEADER_LENGTH} {_shown(header)}: give the JSON header's length in bytes")
    return int(header)


class JsonCount:
    """The JSON part of a body counted as it arrives, before anything is parsed: each ``,`` and ``:`` may start a
    value, each ``[`` and ``{`` opens a list or an object (those inside strings counted too, an upper bound). Past
    ``max_images`` + ``OTHER_VALUES`` of either the request is refused, so parsing never builds millions of
    objects: more values is 413 (more images than are admitted at once), more lists and objects 400 (no request
    of this protocol nests so)."""

    def __init__(self, size: int | None, max_images: int) -> None:
        self.left, self.max_images = size, max_images
        self.most = max_images + OTHER_VALUES
        self.values = self.containers = 0

    def feed(self, chunk: bytes) -> None:
        if self.left is not None:
            if self.left <= 0:
                return
            chunk, self.left = chunk[: self.left], self.left - len(chunk)
        self.containers += chunk.count(b"[") + chunk.count(b"{")
        self.values += chunk.count(b",") + chunk.count(b":")
        if self.containers > self.most:
            raise InferRequestError(
                f"the inference request opens more than {self.most:,} lists and objects: one input of at most "
                f"{self.max_images} images (--max-queue) needs a few"
            )
        if self.values > self.most:
            raise InferRequestError(
                f"the inference request holds more than {self.most:,} JSON values: at most {self.max_images} images "
                "are admitted at once (--max-queue); send fewer in each request",
                413,
            )


def _object(holder: dict, key: str, where: str) -> dict:
    value = holder.get(key)
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise InferRequestError(f"{where}: {key!r} is {_shown(value)}, expected an object")
    return value


def _image_count(shape: Any, where: str, max_images: int) -> int:
    """The number of images ``shape`` says, checked before any image is built."""
    if (
        not isinstance(shape, list)
        or not shape
        or not all(type(size) is int and size >= 0 for size in shape)  # bool, float (1e999, NaN) refused
    ):
        raise InferRequestError(f"{where}: shape {_shown(shape)}, expected a list of whole numbers >= 0 like [3]")
    count = math.prod(shape)
    if count == 0:
        raise InferRequestError(f"{where}: shape {shape} holds no image: send at least one")
    if count > max_images:
        raise InferRequestError(
            f"{where}: shape {_shown(shape)} holds {count:,} images, more than the {max_images} admitted at once "
            "(--max-queue): send them in several requests",
            413,
        )
    return count


def _bytes_elements(data: memoryview, count: int, where: str) -> list[bytes]:
    """A binary BYTES tensor's ``count`` elements: each a little-endian uint32 length, then that many bytes; no
    more lengths are read than ``count``."""
    elements, offset = [], 0
    while len(elements) < count and offset < len(data):
        if offset + 4 > len(data):
            raise InferRequestError(f"{where}: a BYTES element's 4-byte length is cut off at byte {offset}")
        (size,) = struct.unpack_from("<I", data, offset)
        offset += 4
        if offset + size > len(data):
            raise InferRequestError(f"{where}: an element of {size} bytes runs past the tensor's end")
        elements.append(bytes(data[offset : offset + size]))
        offset += size
    if len(elements) < count or offset < len(data):
        held = f"{len(elements)}" if len(elements) < count else f"more than {count}"
        raise InferRequestError(f"{where}: the binary data holds {held} elements, its shape says {count}")
    return elements


def _base64(text: str) -> bytes:
    return b"".join(
        base64.b64decode(text[start : start + BASE64_PIECE], validate=True)
        for start in range(0, len(text), BASE64_PIECE)
    )


def _json_elements(data: Any, shape: list[int], count: int, where: str) -> list[bytes]:
    """``count`` base64 strings, flat or nested as ``shape`` says, decoded."""
    for _ in range(len(shape) - 1):
        if isinstance(data, list) and data and all(isinstance(row, list) for row in data):
            data = [item for row in data for item in row]
    if not isinstance(data, list):
        raise InferRequestError(f"{where}: 'data' is {_shown(data)}, expected a list of base64 strings (the images)")
    if len(data) != count:
        raise InferRequestError(f"{where}: shape {shape} says {count} images, 'data' holds {len(data)}")
    strange = next((item for item in data if not isinstance(item, str)), None)
    if strange is not None:
        raise InferRequestError(f"{where}: 'data' holds {_shown(strange)}, expected base64 strings (the images)")
    try:
        return [_base64(item) for item in data]
    except binascii.Error as error:
        raise InferRequestError(f"{where}: an element is not base64 ({error})") from None


def _outputs(request: dict, everything_binary: bool) -> dict[str, bool]:
    wanted = request.get("outputs")
    if wanted is None:
        wanted = [{"name": LABEL_OUTPUT}, {"name": PROBABILITIES_OUTPUT}]
    if not isinstance(wanted, list) or not wanted:
        raise InferRequestError(f'\'outputs\' is {_shown(wanted)}, expected a list like [{{"name": "label"}}]')
    outputs = {}
    for output in wanted:
        name = output.get("name") if isinstance(output, dict) else None
        if name not in (LABEL_OUTPUT, PROBABILITIES_OUTPUT):
            raise InferRequestError(
                f"output {_shown(name)} unknown: outputs are {LABEL_OUTPUT!r}, {PROBABILITIES_OUTPUT!r}"
            )
        outputs[name] = bool(_object(output, "parameters", f"output {name!r}").get("binary_data", everything_binary))
    return outputs


def parse_infer_request(body: bytes, size: int | None, max_images: int) -> InferRequest:
    """The images of a request body: JSON, or a JSON header of ``size`` bytes and binary tensors. The images are
    counted from the shape before any is built; more than ``max_images`` is 413. Blocking (base64 and JSON of up
    to a whole body): a thread's work."""
    size = len(body) if size is None else size
    if size > len(body):
        raise InferRequestError(f"{HEADER_LENGTH} {size} does not fit a body of {len(body)} bytes")
    try:
        request = json.loads(body[:size])
    except RecursionError:
        raise InferRequestError("the inference request nests lists or objects deeper than JSON is read") from None
    except (ValueError, UnicodeDecodeError) as error:
        raise InferRequestError(f"the inference request is not JSON ({_shown(str(error), 120)})") from None
    inputs = request.get("inputs") if isinstance(request, dict) else None
    if not isinstance(inputs, list) or len(inputs) != 1 or not isinstance(inputs[0], dict):
        raise InferRequestError(f"give exactly one input, a BYTES tensor named {INPUT_NAME!r} of encoded images")
    tensor = inputs[0]
    where = f"input {_shown(tensor.get('name'))}"
    if tensor.get("datatype") != "BYTES":
        raise InferRequestError(
            f"{where}: datatype {_shown(tensor.get('datatype'))}, expected 'BYTES' (encoded images)"
        )
    count = _image_count(tensor.get("shape"), where, max_images)
    binary_size = _object(tensor, "parameters", where).get("binary_data_size")
    if binary_size is not None:
        binary = memoryview(body)[size:]
        if type(binary_size) is not int or not 0 <= binary_size <= len(binary):
            raise InferRequestError(f"{where}: binary_data_size {_shown(binary_size)}, the body holds {len(binary)}")
        images = _bytes_elements(binary[:binary_size], count, where)
    else:
        images = _json_elements(tensor.get("data"), tensor["shape"], count, where)
    everything_binary = bool(_object(request, "parameters", "the request").get("binary_data_output", False))
    request_id = request.get("id")
    return InferRequest(
        request_id if isinstance(request_id, str) else None, images, _outputs(request, everything_binary)
    )


def infer_response(
    request: InferRequest,
    model_name: str,
    model_version: str,
    labels: list[str],
    probabilities: np.ndarray,
    precision: str = "fp32",
) -> tuple[bytes, dict[str, str]]:
    """The response body and its headers; the precision that answered in the response's ``parameters``."""
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
    response: dict[str, Any] = {
        "model_name": model_name,
        "model_version": model_version,
        "parameters": {"precision": precision},
        "outputs": outputs,
    }
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
