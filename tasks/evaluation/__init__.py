"""Score Image Model and Evaluate Model: ``score`` (a ModelDirectory scores an ImageDirectory into Azure's table,
batched; torch), ``evaluate`` (scikit-learn's figures from a scores table; no torch), ``comparison`` (two tables
or registered versions side by side), ``gallery`` (the misclassified images), ``plots`` (curves and confusion
matrices as PNGs), ``onnx_export`` (model.onnx, checked against PyTorch) and ``prefect_tasks`` (the tasks
``score``, ``evaluate``, ``show_misclassified``, ``export_and_check_onnx`` and ``compare``; the only module here
that imports Prefect, and it loads torch only when a run scores or exports). Nothing is imported here: importing
the package imports neither torch nor Prefect."""
