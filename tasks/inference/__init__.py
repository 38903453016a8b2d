"""The one loaded model under every inference path: ``predict``, scoring and its shards, the endpoint and the
benchmarks hold a ``LoadedModel`` (tasks/inference/loaded.py): the runtime (PyTorch, traced on the CPU; ONNX
Runtime; int8 through ONNX Runtime's static quantization, tasks/inference/int8.py), the device, the one decode
(``tasks.vision.images.decode_image``: EXIF orientation, HEIC, the typed ``UnreadableImageError``), the model's
deterministic transform, batched forward passes, the one softmax, top-k and the penultimate-layer embeddings.
Imports no Prefect."""
