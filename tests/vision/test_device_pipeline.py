"""The batch pipeline that decodes and transforms on the training device (tasks/vision/device_pipeline.py), run
here on the CPU: the same code runs on CUDA in tests/test_gpu.py. Its random steps give the per-image CPU path's
pixels to the bit; its decoding agrees with PIL's within what two JPEG decoders and two resizers differ by."""

import threading

import numpy as np
import pytest
import torch
from PIL import Image, ImageOps

from tasks.contracts.image_directory import EXIF_ORIENTATION
from tasks.errors import UnreadableImageError
from tasks.vision.device_pipeline import DecodedAhead, turned_upright
from tasks.vision.images import ImageFiles
from tasks.vision.payloads import EncodedImageFiles, PackedPayloads, collate_payloads, exif_orientation, is_jpeg
from tests.helpers import write_phone_photos
from tests.vision.device_batches import pipeline_for, write_images


@pytest.mark.parametrize(
    "options",
    [
        {},  # the default: edge-padded random crop
        {"random_horizontal_flip": True, "random_vertical_flip": {"p": 0.3}},
        {"random_crop": None, "random_horizontal_flip": True},
        {"random_crop": {"size": 24, "padding": 0.4}, "random_horizontal_flip": True},
    ],
)
def test_the_batched_random_steps_give_the_per_image_pixels_to_the_bit(options):
    pipeline = pipeline_for(options)
    assert pipeline.batched
    batch = torch.randint(0, 256, (40, 3, 32, 32), dtype=torch.uint8)
    torch.manual_seed(7)
    one_by_one = torch.stack([pipeline.transform.augment(pixels) for pixels in batch])
    torch.manual_seed(7)
    batched = pipeline.augment(batch)
    assert batched.dtype == torch.uint8 and batched.shape == one_by_one.shape
    assert torch.equal(batched, one_by_one)
    # Not the identity: crops reached into the padding and flips happened, differently per image.
    assert not torch.equal(batched, batch) and len({tuple(image.flatten()[:40].tolist()) for image in batched}) > 1


def test_random_steps_it_has_no_batched_form_for_run_image_by_image_with_the_same_draws():
    pipeline = pipeline_for({"random_rotation": {"degrees": 20}, "random_horizontal_flip": True})
    assert not pipeline.batched
    batch = torch.randint(0, 256, (6, 3, 32, 32), dtype=torch.uint8)
    torch.manual_seed(3)
    one_by_one = torch.stack([pipeline.transform.augment(pixels) for pixels in batch])
    torch.manual_seed(3)
    assert torch.equal(pipeline.augment(batch), one_by_one)


def test_decoding_a_batch_of_mixed_images_agrees_with_the_cpu_path(tmp_path):
    sizes = [(48, 40), (48, 40), (64, 64), (37, 90), (48, 40)]
    jpegs = write_images(tmp_path, sizes) + write_images(tmp_path / "..", [(50, 50)], mode="L")
    pngs = write_images(tmp_path, [(40, 30), (16, 16)], suffix=".png")
    samples = [(path, i % 2) for i, path in enumerate(jpegs + pngs)]
    pipeline = pipeline_for({}, training=False)
    dataset = EncodedImageFiles(samples, pipeline.transform)
    items = [dataset[i] for i in range(len(dataset))]
    payloads, labels = collate_payloads(items)

    # The batch travels as two tensors (PackedPayloads) and unpacks to each image's payload, unchanged.
    assert isinstance(payloads, PackedPayloads) and payloads.data.dim() == 1 and payloads.shapes.shape == (8, 3)
    unpacked = payloads.unpack()
    assert all(torch.equal(a, b) for a, (b, _) in zip(unpacked, items, strict=True))
    assert [payload.dim() for payload in unpacked] == [1] * 6 + [3] * 2, "JPEGs travel encoded, PNGs decoded"
    assert all(is_jpeg(payload) for payload in unpacked[:6]) and labels.tolist() == [0, 1, 0, 1, 0, 1, 0, 1]
    on_device = pipeline.decode(payloads)
    assert torch.equal(on_device, pipeline.decode(unpacked)), "packed or a list: one result"
    reference = ImageFiles(samples, pipeline.transform, normalized=False)
    expected = torch.stack([reference[i][0] for i in range(len(reference))])
    assert on_device.shape == expected.shape == (8, 3, 32, 32) and on_device.dtype == torch.uint8
    assert torch.equal(on_device[6:], expected[6:]), "other formats take the CPU path itself"
    # JPEGs: libjpeg-turbo through torchvision and through PIL decode alike; the resize is torch's antialiased
    # bilinear instead of PIL's: measured 0.04 grey levels apart on average, 1 at most.
    difference = (on_device[:6].int() - expected[:6].int()).abs()
    print(f"JPEG path vs PIL: mean {difference.float().mean():.3f}, max {difference.max()} grey levels")
    assert difference.float().mean() < 0.25 and difference.max() <= 2
    normalised = pipeline(payloads, training=False)
    assert normalised.dtype == torch.float32 and torch.equal(normalised, pipeline.transform.normalize(on_device))


@pytest.mark.parametrize("orientation", range(1, 9))
def test_each_exif_orientation_is_turned_as_pil_turns_it(orientation):
    stored = Image.fromarray(np.random.default_rng(orientation).integers(0, 256, (5, 7, 3), dtype=np.uint8))
    stored.getexif()[EXIF_ORIENTATION] = orientation
    displayed = np.asarray(ImageOps.exif_transpose(stored))
    turned = turned_upright(torch.from_numpy(np.array(stored)).permute(2, 0, 1), orientation)
    assert np.array_equal(turned.permute(1, 2, 0).numpy(), displayed)


def test_phone_photos_are_seen_upright_by_both_decode_paths(tmp_path):
    """A photo stored sideways with its EXIF Orientation tag reaches the network as every viewer shows it, whether
    the loader decodes it (PIL) or the device pipeline does (nvJPEG or libjpeg-turbo, then turned on the device)."""
    photos = write_phone_photos(tmp_path)
    samples = [(path, 0) for path in photos]
    pipeline = pipeline_for({}, training=False)
    dataset = EncodedImageFiles(samples, pipeline.transform)
    # Packed by a loader process, as training packs them: the orientations travel in the batch's shape table.
    loader = torch.utils.data.DataLoader(dataset, batch_size=8, num_workers=1, collate_fn=collate_payloads)
    ((payloads, _),) = list(loader)
    # Read while packing (in the loader's processes), and again from the bytes when a plain list comes.
    assert payloads.orientations() == [exif_orientation(payload) for payload in payloads.unpack()] == list(range(1, 9))
    assert exif_orientation(torch.tensor(list(b"\xff\xd8\xff\xe0 no metadata"), dtype=torch.uint8)) == 1

    on_device = pipeline.decode(payloads)
    assert torch.equal(on_device, pipeline.decode(payloads.unpack())), "packed or a list: one result"
    loader = ImageFiles(samples, pipeline.transform, normalized=False)
    by_loader = torch.stack([loader[i][0] for i in range(len(loader))])
    displayed = []
    for path in photos:
        with Image.open(path) as photo:
            displayed.append(pipeline.transform.decode(ImageOps.exif_transpose(photo).convert("RGB")))
    displayed = torch.stack(displayed)
    as_stored = pipeline.transform.decode(Image.open(photos[0]).convert("RGB"))  # orientation 1: never turned
    assert torch.equal(by_loader, displayed), "the loader's PIL path turns each photo as PIL shows it"
    apart = (on_device.int() - displayed.int()).abs().float().mean(dim=(1, 2, 3))
    wrong_way = (as_stored.int() - displayed.int()).abs().float().mean(dim=(1, 2, 3))
    print(f"device path vs upright, grey levels per photo: {apart.tolist()}; left as stored: {wrong_way.tolist()}")
    assert apart.max() < 1.0 and wrong_way[1:].min() > 10


def test_a_file_that_only_claims_to_be_a_jpeg_is_left_to_pil_which_names_it(tmp_path):
    broken = tmp_path / "broken.jpg"
    broken.write_bytes(b"\xff\xd8\xff\xe0" + b"\x00" * 64)
    pipeline = pipeline_for({}, training=False)
    payload, _ = EncodedImageFiles([(broken, 0)], pipeline.transform)[0]
    with pytest.raises(UnreadableImageError, match="not an image Pillow can read"):  # what the CPU path raises for it
        pipeline.decode([payload])


def test_decoding_ahead_in_a_thread_hands_over_every_batch_in_order_and_raises_its_errors(tmp_path):
    pipeline = pipeline_for({}, training=False)
    samples = [(path, i) for i, path in enumerate(write_images(tmp_path, [(40, 30), (30, 40), (64, 48)] * 3))]
    dataset = EncodedImageFiles(samples, pipeline.transform)
    loader = torch.utils.data.DataLoader(dataset, batch_size=2, collate_fn=collate_payloads)
    expected = [(pipeline.decode(payloads), labels) for payloads, labels in loader]
    ahead = DecodedAhead(loader, pipeline, ahead=1)
    got = list(ahead)
    assert len(ahead) == len(got) == 5
    assert all(torch.equal(a, b) and torch.equal(c, d) for (a, c), (b, d) in zip(got, expected, strict=True))

    first = iter(ahead)  # a consumer that stops after one batch leaves no thread behind
    next(first)
    first.close()
    assert not [thread for thread in threading.enumerate() if thread.name == "decode-ahead"]

    samples[3] = (tmp_path / "missing.jpg", 0)
    broken = DecodedAhead(
        torch.utils.data.DataLoader(
            EncodedImageFiles(samples, pipeline.transform), batch_size=2, collate_fn=collate_payloads
        ),
        pipeline,
    )
    with pytest.raises(FileNotFoundError):
        list(broken)
