"""torchvision networks and image tensors, shared by training (the worker), scoring and ONNX export.

    networks.py         a network for a ModelSpec (from scratch or from a weights file), a trained ModelDirectory's
                        network
    weights.py          pretrained weights: cache, mirror or URL, hash-checked; the copy staged for training nodes
    transforms.py       ImageTransformations → decode, augment, normalise (torchvision)
    images.py           ImageFiles (the decoded-image cache); the image size a data set is trained at
    payloads.py         what the loader hands the device: a JPEG's bytes, a batch packed into two tensors; batches
                        read by threads for scoring
    device_pipeline.py  decode_on="device": the device decodes, turns phone photos upright and transforms batches

Plain PyTorch: no Prefect import. Nothing is imported here: importing the package imports no torch.
"""
