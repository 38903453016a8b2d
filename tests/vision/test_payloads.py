import torch

from tasks.vision.payloads import EncodedImageFiles, PackedPayloads, collate_payloads, threaded_batches
from tests.vision.device_batches import pipeline_for, write_images


def test_loader_processes_hand_a_batch_over_packed(tmp_path):
    """Across the DataLoader's process boundary (two worker processes), as training with ``decode_on="device"`` gets
    it: one PackedPayloads per batch, which unpacks to the files' own payloads."""
    jpegs = write_images(tmp_path, [(40, 30), (33, 57), (48, 48)])
    pngs = write_images(tmp_path, [(20, 20)], suffix=".png")
    samples = [(path, i) for i, path in enumerate(jpegs + pngs)]
    dataset = EncodedImageFiles(samples, pipeline_for({}, training=False).transform)
    loader = torch.utils.data.DataLoader(dataset, batch_size=2, num_workers=2, collate_fn=collate_payloads)
    batches = list(loader)
    assert all(isinstance(payloads, PackedPayloads) for payloads, _ in batches)
    handed_over = [payload for payloads, _ in batches for payload in payloads.unpack()]
    assert all(torch.equal(a, dataset[i][0]) for i, a in enumerate(handed_over))
    assert [labels.tolist() for _, labels in batches] == [[0, 1], [2, 3]]


def test_threads_read_every_batch_in_order():
    dataset = [(torch.tensor([i]), i) for i in range(23)]
    batches = list(threaded_batches(dataset, 5, collate_payloads, threads=3, ahead=2))
    assert [labels.tolist() for _, labels in batches] == [list(range(s, min(s + 5, 23))) for s in range(0, 23, 5)]
