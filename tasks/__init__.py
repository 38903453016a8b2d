"""Pipeline stages. A stage is imported from the module that defines it (``from tasks.convert.conversion import
convert_to_image_directory``), as the flows do; importing a package imports neither torch nor Prefect. The public
Python API is ``from flows import …`` (flows/__init__.py); the layers these packages sit on: tests/test_layers.py.

Packages (the plain functions in their modules; the Prefect tasks of each in its ``prefect_tasks.py``):

    contracts/        what one stage writes and the next reads: ImageDirectory, ModelDirectory, scores table,
                      registry layout, TrainingParams, ConversionLimits, ImageTransformations, the family table
    convert/          Convert to Image Directory: a folder, archive or S3 prefix of images → ImageDirectory
    data/             the data before training: the bundled digits, split, label validation, preflight checks
    model/            the model a training starts from: ModelSpec → UntrainedModelDirectory, weights staged
    launch/           how a training is started and watched: torchrun, its output, multi-node, lost runs
    training/         the torchrun worker (plain PyTorch, no Prefect)
    vision/           torchvision networks and image tensors (training, scoring, ONNX)
    evaluation/       Score Image Model, Evaluate Model, comparison, gallery, plots, ONNX export
    score_shards/     scoring in shards over the work pool
    sweep/            hyperparameter sweeps (Optuna)
    registry/         the model registry: versions, aliases, promotion, the command line
    storage/          where files live: S3, local files, run folders, secrets' files (no contract)
    work_dir/         a run folder or training output on S3 and its copy in this host's cache
    near_duplicates/  perceptual hashes and near-duplicate pairs
    predict/          Classifier: a trained model labelling a few photos, no Prefect
    serving/          the online endpoint: batching, the alias followed, the Open Inference Protocol
    outages/          riding out a Prefect server's restart

Flat leaves, shared by the packages and small enough to stay alone:

    errors.py     every typed error (PipelineInputError: never retried)
    retrying.py   ``stage_task``, the one Prefect task decorator, and its retry rule
    progress.py   a progress line while a long step runs
    console.py    Prefect's console filtered for a while
    memory.py     a process's own peak memory
    allocator.py  glibc malloc kept from returning batch-sized blocks to the kernel
"""

# The names ``from tasks import …`` gave before the stages moved into packages (2026-11, issue 42), each with the
# public name that does its work now (``from flows import …``, flows/__init__.py): importing one raises an ImportError
# that says so.
_MOVED = {
    name: name
    for name in (
        "convert_to_image_directory",
        "split_image_directory",
        "check_training_data",
        "export_digits",
        "write_untrained_model_directory",
        "launch_training",
        "score_images",
        "evaluate_scores",
        "register_model",
        "ImageDirectory",
        "ModelDirectory",
        "ModelSpec",
        "TrainingParams",
        "Normalisation",
        "PipelineInputError",
    )
} | {"build_torchrun_command": "launch_training", "run_training": "launch_training"}  # launch_training builds and runs


def __getattr__(name: str):
    if name in _MOVED:
        raise ImportError(f"'from tasks import {name}' moved: use 'from flows import {_MOVED[name]}'", name=name)
    raise AttributeError(f"module 'tasks' has no attribute {name!r}")
