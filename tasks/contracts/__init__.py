"""The contracts between stages: what one stage writes and the next reads, each defined once here and imported
by every stage that touches it. Nothing here imports torch or Prefect; a contract imports only contracts, errors
and storage leaves.

    image_directory.py   ImageDirectory: class-per-folder images, ``image_directory.json`` (the summary)
    image_index.py       its per-image columns (``image_index.npz``), memory-mapped by every reader
    index_writer.py      IndexWriter: the columns written as a conversion stores images
    model_directory.py   (Untrained)ModelDirectory: the spec, weights, classes, metrics of a training
    architectures.py     the family table: every torchvision classifier a ModelSpec may name, its head and options
    transformations.py   ImageTransformations: the image options stored in a ModelSpec (typed, no torch)
    scores_table.py      the scores table: column names, written chunk by chunk, read back, summarised
    registry_layout.py   the registry's names, references, records and the keys they are stored under
    training_config.py   the parameter objects a training is given: TrainingFolders and TrainingParams
    conversion_limits.py the parameter object a conversion is given: ConversionLimits

One other parameter object lives with the one stage that reads it: ``PromotionPolicy`` (``tasks.registry.promotion``).
"""
