"""Score Image Model and Evaluate Model: ``score`` (a ModelDirectory scores an ImageDirectory into Azure's table,
batched; torch), ``evaluate`` (scikit-learn's figures from a scores table; no torch), ``comparison`` (two tables
or registered versions side by side), ``gallery`` (the misclassified images), ``plots`` (curves and confusion
matrices as PNGs) and ``onnx_export`` (model.onnx, checked against PyTorch). Nothing is imported here: importing
the package imports neither torch nor Prefect."""
