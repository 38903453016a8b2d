"""What one function holds: the dynamic batcher (tasks/serving/batching.py) with a plain function for the forward
pass, and the Open Inference Protocol's encodings (tasks/serving/oip.py) against tritonclient's own."""

from __future__ import annotations

import asyncio
import base64
import json
import time

import numpy as np
import pytest

from tasks.serving import oip
from tasks.serving.batching import Batcher


def run_batcher(forward, items, **settings):
    """Each item's result or exception, with ``items`` submitted at once; and the batch sizes that ran."""
    sizes = []

    async def main():
        batcher = Batcher(forward, on_batch=lambda size, _: sizes.append(size), **settings)
        batcher.start()
        results = await asyncio.gather(*(batcher.submit(item) for item in items), return_exceptions=True)
        await batcher.stop()
        return results

    return asyncio.run(main()), sizes


def test_waiting_items_share_passes_up_to_the_batch_size_and_keep_their_order():
    results, sizes = run_batcher(
        lambda batch: [item * 10 for item in batch], range(20), max_batch_size=8, max_wait_s=0.05
    )
    assert results == [item * 10 for item in range(20)]
    assert sizes == [8, 8, 4]


def test_a_pass_that_raises_fails_its_batch_only_and_the_next_runs():
    def forward(batch):
        if 3 in batch:
            raise RuntimeError("out of memory")
        return batch

    results, sizes = run_batcher(forward, range(8), max_batch_size=4, max_wait_s=0.05)
    assert [type(r).__name__ if isinstance(r, Exception) else r for r in results] == [
        *["RuntimeError"] * 4,
        *range(4, 8),
    ]
    assert sizes == [4, 4]


def test_a_batch_waits_for_announced_requests_only():
    """Requests announced (their bodies being read) are waited for, up to max_wait; with none on its way a lone image
    runs at once however long max_wait is."""
    sizes = []

    async def main():
        batcher = Batcher(lambda b: b, max_batch_size=8, max_wait_s=60, on_batch=lambda n, _: sizes.append(n))
        batcher.start()
        assert await asyncio.wait_for(batcher.submit("alone"), 10) == "alone"  # not 60 s: nothing announced
        batcher.announce(2)  # two requests arriving
        first = batcher.enqueue(1)
        batcher.withdraw()  # the first arrived
        await asyncio.sleep(0.2)  # its batch holds it and waits for the second
        assert not first.done() and sizes == [1]
        second = batcher.enqueue(2)
        batcher.withdraw()
        rest = await asyncio.wait_for(asyncio.gather(first, second), 10)
        await batcher.stop()
        return rest

    assert asyncio.run(main()) == [1, 2] and sizes == [1, 2]
    with pytest.raises(ValueError, match="max_batch_size 0"):
        Batcher(lambda batch: batch, max_batch_size=0, max_wait_s=0)


def test_batches_run_while_the_event_loop_is_busy():
    """The batcher's own thread takes the next batch the moment a pass ends: with the event loop held (reading and
    answering other requests), every queued batch still runs; their answers arrive once the loop is free."""
    sizes = []

    def forward(batch):
        time.sleep(0.01)
        return batch

    async def main():
        batcher = Batcher(forward, max_batch_size=4, max_wait_s=0, on_batch=lambda n, _: sizes.append(n))
        batcher.start()
        answers = [batcher.enqueue(item) for item in range(16)]
        time.sleep(2)  # the loop is busy: nothing of it runs meanwhile
        ran = list(sizes)
        results = await asyncio.wait_for(asyncio.gather(*answers), 10)
        await batcher.stop()
        return ran, results

    ran, results = asyncio.run(main())
    assert ran == [4, 4, 4, 4] and results == list(range(16))


def test_an_item_s_own_failure_fails_it_alone():
    results, sizes = run_batcher(
        lambda batch: [ValueError(f"bad {item}") if item == 2 else item for item in batch],
        range(4),
        max_batch_size=4,
        max_wait_s=0.05,
    )
    assert [str(r) if isinstance(r, Exception) else r for r in results] == [0, 1, "bad 2", 3] and sizes == [4]


def test_tritonclient_s_binary_request_is_read_and_the_answer_encoded_as_asked():
    from tritonclient.http import InferInput, InferRequestedOutput
    from tritonclient.http._utils import _get_inference_request

    images = [b"\xff\xd8\xff first", b"\x89PNG second"]
    tensor = InferInput("image", [2], "BYTES")
    tensor.set_data_from_numpy(np.array(images, dtype=np.object_))
    body, header_length = _get_inference_request(
        [tensor], "req-7", [InferRequestedOutput("label", binary_data=False)], 0, False, False, 0, None, None
    )
    request = oip.parse_infer_request(body, header_length, 8)
    assert (request.id, request.images, request.binary_outputs) == ("req-7", images, {"label": False})

    probabilities = np.array([[0.25, 0.75], [0.5, 0.5]], dtype=np.float32)
    answer, headers = oip.infer_response(request, "m", "3", ["b", "a"], probabilities)
    assert headers == {"Content-Type": "application/json"}
    assert json.loads(answer)["outputs"] == [{"name": "label", "datatype": "BYTES", "shape": [2], "data": ["b", "a"]}]

    binary = oip.InferRequest(None, images, {"probabilities": True})
    answer, headers = oip.infer_response(binary, "m", "3", ["b", "a"], probabilities)
    size = int(headers[oip.HEADER_LENGTH])
    assert np.array_equal(np.frombuffer(answer[size:], dtype="<f4").reshape(2, 2), probabilities)


def test_a_json_request_takes_base64_and_a_bad_one_is_told():
    encoded = base64.b64encode(b"image bytes").decode()
    body = {"inputs": [{"name": "image", "datatype": "BYTES", "shape": [1], "data": [encoded]}]}
    assert oip.parse_infer_request(json.dumps(body).encode(), None, 8).images == [b"image bytes"]
    for broken, message in (
        ({"inputs": []}, "exactly one input"),
        ({"inputs": [{**body["inputs"][0], "datatype": "FP32"}]}, "expected 'BYTES'"),
        ({"inputs": [{**body["inputs"][0], "data": ["%%%"]}]}, "not base64"),
        ({"inputs": [{**body["inputs"][0], "shape": [2]}]}, "says 2 images, 'data' holds 1"),
        ({**body, "outputs": [{"name": "logits"}]}, "output 'logits' unknown"),
    ):
        with pytest.raises(oip.InferRequestError, match=message):
            oip.parse_infer_request(json.dumps(broken).encode(), None, 8)
    with pytest.raises(oip.InferRequestError, match="not JSON"):
        oip.parse_infer_request(b"{", None, 8)
