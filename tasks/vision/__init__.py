"""torchvision networks and image tensors, shared by training (the worker), scoring and ONNX export.

    networks.py  a network for a ModelSpec (from scratch or from a weights file), a trained ModelDirectory's network
    weights.py   pretrained weights: cache, mirror or URL, hash-checked; the copy staged for training nodes
    images.py    the image size a data set is trained at; decode, augment, normalise; an ImageDirectory as tensors

Plain PyTorch: no Prefect import.
"""
