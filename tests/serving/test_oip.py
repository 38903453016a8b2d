"""The Open Inference Protocol's request and response, in both encodings (JSON and Triton's binary tensors)."""

import base64
import json
import struct

import numpy as np
import pytest

from tasks.serving.oip import (
    HEADER_LENGTH,
    InferRequestError,
    infer_response,
    model_metadata,
    parse_infer_request,
)

PNG, JPEG = b"\x89PNG fake image", b"\xff\xd8 another image"


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
    request = parse_infer_request(json_request(), None)
    assert (request.id, request.images) == ("r1", [PNG, JPEG])
    assert request.binary_outputs == {"label": False, "probabilities": False}


def test_a_binary_request_gives_the_same_images():
    body, length = binary_request(binary_outputs=True)
    request = parse_infer_request(body, length)
    assert (request.id, request.images) == (None, [PNG, JPEG])
    assert request.binary_outputs == {"label": True, "probabilities": True}


@pytest.mark.parametrize(
    ("body", "length", "told"),
    [
        (b"not json", None, "the inference request is not JSON"),
        (json_request(), "many", f"{HEADER_LENGTH} 'many' is not a number of bytes"),
        (json_request(), "100000", f"{HEADER_LENGTH} 100000 does not fit a body of"),
        (json.dumps({"inputs": []}).encode(), None, "give exactly one input, a BYTES tensor named 'image'"),
        (json_request().replace(b'"BYTES"', b'"FP32"'), None, "input 'image': datatype 'FP32', expected 'BYTES'"),
        (json_request().replace(b'"shape": [2]', b'"shape": [3]'), None, "shape [3] does not hold its 2 elements"),
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
        parse_infer_request(body, length)
    assert told in str(refused.value)


def test_a_binary_tensor_cut_short_is_refused():
    body, length = binary_request()
    with pytest.raises(InferRequestError, match="binary_data_size 39, the body holds 36"):
        parse_infer_request(body[:-3], length)
    tensor = {"name": "image", "datatype": "BYTES", "shape": [1], "parameters": {"binary_data_size": 9}}
    header = json.dumps({"inputs": [tensor]}).encode()
    with pytest.raises(InferRequestError, match="an element of 100 bytes runs past the tensor's end"):
        parse_infer_request(header + struct.pack("<I", 100) + b"short", str(len(header)))


def test_the_response_answers_as_asked_json_or_binary():
    probabilities = np.array([[0.9, 0.1], [0.2, 0.8]], dtype=np.float32)
    as_json = parse_infer_request(json_request(), None)
    body, headers = infer_response(as_json, "digits", "3", ["cat", "dog"], probabilities)
    assert headers == {"Content-Type": "application/json"}
    answer = json.loads(body)
    assert (answer["model_name"], answer["model_version"], answer["id"]) == ("digits", "3", "r1")
    label, probs = answer["outputs"]
    assert label == {"name": "label", "datatype": "BYTES", "shape": [2], "data": ["cat", "dog"]}
    assert probs["shape"] == [2, 2] and probs["data"] == pytest.approx([0.9, 0.1, 0.2, 0.8])

    as_binary = parse_infer_request(*binary_request(binary_outputs=True))
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
