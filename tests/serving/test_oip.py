"""The Open Inference Protocol's request and response, in both encodings (JSON and Triton's binary tensors)."""

import base64
import json
import struct

import numpy as np
import pytest

from tasks.serving.oip import (
    HEADER_LENGTH,
    OTHER_VALUES,
    InferRequestError,
    JsonCount,
    infer_response,
    json_size,
    model_metadata,
    parse_infer_request,
)

PNG, JPEG = b"\x89PNG fake image", b"\xff\xd8 another image"


def parse(body: bytes, length: str | None = None, max_images: int = 8):
    """As the endpoint reads a request: its JSON counted as it arrives (in 64 KiB chunks), then parsed."""
    size = json_size(length)
    count = JsonCount(size, max_images)
    for start in range(0, len(body), 2**16):
        count.feed(body[start : start + 2**16])
    return parse_infer_request(body, size, max_images)


def json_request(images=(PNG, JPEG), **changes) -> bytes:
    tensor = {"name": "image", "datatype": "BYTES", "shape": [len(images)]}
    tensor["data"] = [base64.b64encode(image).decode() for image in images]
    return json.dumps({"id": "r1", "inputs": [tensor], **changes}).encode()


def binary_request(images=(PNG, JPEG), binary_outputs: bool = False) -> tuple[bytes, str]:
    elements = b"".join(struct.pack("<I", len(image)) + image for image in images)
    tensor = {"name": "image", "datatype": "BYTES", "shape": [len(images)]}
    tensor["parameters"] = {"binary_data_size": len(elements)}
    header = json.dumps({"inputs": [tensor], "parameters": {"binary_data_output": binary_outputs}}).encode()
    return header + elements, str(len(header))


def test_a_json_request_gives_its_images_and_asks_for_both_outputs_as_json():
    request = parse(json_request())
    assert (request.id, request.images) == ("r1", [PNG, JPEG])
    assert request.binary_outputs == {"label": False, "probabilities": False}


def test_a_binary_request_gives_the_same_images():
    body, length = binary_request(binary_outputs=True)
    request = parse(body, length)
    assert (request.id, request.images) == (None, [PNG, JPEG])
    assert request.binary_outputs == {"label": True, "probabilities": True}


@pytest.mark.parametrize(
    ("body", "length", "told"),
    [
        (b"not json", None, "the inference request is not JSON"),
        (json_request(), "many", f"{HEADER_LENGTH} 'many': give the JSON header's length in bytes"),
        (json_request(), "100000", f"{HEADER_LENGTH} 100000 does not fit a body of"),
        (json.dumps({"inputs": []}).encode(), None, "give exactly one input, a BYTES tensor named 'image'"),
        (json_request().replace(b'"BYTES"', b'"FP32"'), None, "input 'image': datatype 'FP32', expected 'BYTES'"),
        (json_request().replace(b'"shape": [2]', b'"shape": [3]'), None, "shape [3] says 3 images, 'data' holds 2"),
        (json_request(outputs=[{"name": "logits"}]), None, "output 'logits' unknown: outputs are 'label'"),
        (
            json.dumps({"inputs": [{"name": "image", "datatype": "BYTES", "shape": [1], "data": ["%%"]}]}).encode(),
            None,
            "input 'image': an element is not base64",
        ),
    ],
)
def test_a_request_the_endpoint_cannot_read_says_why(body, length, told):
    with pytest.raises(InferRequestError) as refused:
        parse(body, length)
    assert told in str(refused.value) and refused.value.status == 400


def test_a_binary_tensor_cut_short_is_refused():
    body, length = binary_request()
    with pytest.raises(InferRequestError, match="binary_data_size 39, the body holds 36"):
        parse(body[:-3], length)
    tensor = {"name": "image", "datatype": "BYTES", "shape": [1], "parameters": {"binary_data_size": 9}}
    header = json.dumps({"inputs": [tensor]}).encode()
    with pytest.raises(InferRequestError, match="an element of 100 bytes runs past the tensor's end"):
        parse(header + struct.pack("<I", 100) + b"short", str(len(header)))
    with pytest.raises(InferRequestError, match="holds more than 1 elements, its shape says 1"):
        parse(header + struct.pack("<I", 1) + b"a" + struct.pack("<I", 0), str(len(header)))


def test_images_are_counted_before_any_is_built_and_past_the_queue_it_is_413():
    """Millions of empty strings or zero-length elements: refused as their JSON arrives, or from the shape."""
    many = OTHER_VALUES + 8 + 1
    with pytest.raises(InferRequestError, match=f"more than {OTHER_VALUES + 8:,} JSON values") as refused:
        parse(json_request(images=[b""] * many))
    assert refused.value.status == 413
    body, length = binary_request(images=[b""] * many)
    with pytest.raises(
        InferRequestError, match=f"shape \\[{many}\\] holds {many:,} images, more than the 8"
    ) as refused:
        parse(body, length)
    assert refused.value.status == 413
    nested = b'{"inputs": ' + b"[" * 100_000 + b"]" * 100_000 + b"}"
    with pytest.raises(InferRequestError, match="opens more than") as refused:
        parse(nested)
    assert refused.value.status == 400
    with pytest.raises(InferRequestError, match="nests lists or objects deeper than JSON is read"):
        parse_infer_request(nested, None, 8)  # past the count too: the parser's own depth
    nine = json_request(images=[PNG] * 9)
    with pytest.raises(InferRequestError, match="holds 9 images, more than the 8 admitted at once") as refused:
        parse(nine)
    assert refused.value.status == 413
    assert len(parse(nine, max_images=9).images) == 9


def test_the_response_answers_as_asked_json_or_binary():
    probabilities = np.array([[0.9, 0.1], [0.2, 0.8]], dtype=np.float32)
    as_json = parse(json_request())
    body, headers = infer_response(as_json, "digits", "3", ["cat", "dog"], probabilities)
    assert headers == {"Content-Type": "application/json"}
    answer = json.loads(body)
    assert (answer["model_name"], answer["model_version"], answer["id"]) == ("digits", "3", "r1")
    label, probs = answer["outputs"]
    assert label == {"name": "label", "datatype": "BYTES", "shape": [2], "data": ["cat", "dog"]}
    assert probs["shape"] == [2, 2] and probs["data"] == pytest.approx([0.9, 0.1, 0.2, 0.8])

    as_binary = parse(*binary_request(binary_outputs=True))
    body, headers = infer_response(as_binary, "digits", "3", ["cat", "dog"], probabilities)
    header = json.loads(body[: int(headers[HEADER_LENGTH])])
    label, probs = header["outputs"]
    rest = body[int(headers[HEADER_LENGTH]) :]
    labels = rest[: label["parameters"]["binary_data_size"]]
    assert labels == struct.pack("<I", 3) + b"cat" + struct.pack("<I", 3) + b"dog"
    values = np.frombuffer(rest[len(labels) :], dtype="<f4").reshape(probs["shape"])
    assert np.array_equal(values, probabilities)


def test_the_model_metadata_names_the_input_and_outputs():
    metadata = model_metadata("digits", ["3"], "pytorch_torchscript", 10)
    assert metadata["name"] == "digits" and metadata["versions"] == ["3"]
    assert [i["name"] for i in metadata["inputs"]] == ["image"]
    assert [o["name"] for o in metadata["outputs"]] == ["label", "probabilities"]
