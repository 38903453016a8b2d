"""The contracts between stages: what one stage writes and the next reads, each defined once here and imported
by every stage that touches it. Nothing here imports torch or Prefect.

    image_directory.py   ImageDirectory: class-per-folder images, ``image_directory.json`` (the summary)
    image_index.py       its per-image columns (``image_index.npz``), memory-mapped by every reader; IndexWriter
    model_directory.py   (Untrained)ModelDirectory: the spec, weights, classes, metrics of a training
    scores_table.py      the scores table: column names, written chunk by chunk, read back, summarised
    registry_layout.py   the registry's names, references, records and the keys they are stored under
    training_config.py   the parameter objects a training is given: TrainingFolders and TrainingParams
    conversion_limits.py the parameter object a conversion is given: ConversionLimits

Two other parameter objects live with the one stage that reads them: ``ImageTransformations``
(``tasks.contracts.transformations``, stored in a ModelSpec) and ``PromotionPolicy`` (``tasks.registry.promotion``).
"""
