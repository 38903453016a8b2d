"""torchvision networks and image tensors, shared by training (the worker), scoring and ONNX export.

    networks.py  a network for a ModelSpec, local pretrained weights, a trained ModelDirectory's network
    images.py    the image size a data set is trained at; decode, augment, normalise; an ImageDirectory as tensors

Plain PyTorch: no Prefect import.
"""
