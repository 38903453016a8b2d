"""The online endpoint: a registered model answering HTTP requests, batched, following its production alias
(``image-classifier serve MODEL``, ``python -m tasks.serving``; docs/serving.md).

    settings.py   what the command is told (ServeSettings); no torch
    model.py      one version: its files checked (the registry's sha256); a batch of encoded images decoded
                  (scoring's decode and transforms; the device decodes JPEGs on CUDA), then one forward pass
    batching.py   the dynamic batcher: a queue, one forward pass per batch, a failed batch fails only its requests
    endpoint.py   the versions served (primary, canary), the alias followed and the swap without a failed request
    oip.py        the Open Inference Protocol's inference request and response (JSON and binary tensors)
    metrics.py    the Prometheus metrics
    answering.py  a prediction request from admission to answer (the queue's bound, the body limit, the batcher)
    app.py        the FastAPI app: /v1/predict, /v1/model, /healthz, /readyz, /metrics, /v2/…
    server.py     the process: uvicorn, loading while /healthz answers, SIGTERM drained
    __main__.py   the command line

Importing this package imports nothing; FastAPI, uvicorn and torch come with ``server``.
"""
