"""The public Python API (flows/__init__.py PUBLIC): every name imports from ``flows`` and is the object its module
defines; every type a public name takes or gives is public too; the stages chain from images to a served answer with
``from flows import …`` alone; ``import flows`` leaves the environment alone; the names ``from tasks import …`` gave
before round three's move name their public replacement."""

import dataclasses
import importlib
import inspect
import os
import subprocess
import sys
import typing

import numpy as np
import pydantic
import pytest

import flows
from tasks import _MOVED

# Members of public classes that only the stages use: what an ImageDirectory is written from and read into batches as
# (its manifest, its memory-mapped index, its samples), and the near-duplicate groups a split can be handed.
STAGES_ONLY = {"ImageDirectory.write", "ImageDirectory.index", "ImageDirectory.samples", "split_image_directory.groups"}


def test_every_public_name_imports_from_flows_and_is_the_defining_module_s():
    for name, module in flows.PUBLIC.items():
        assert getattr(flows, name) is getattr(importlib.import_module(module), name), name
    assert sorted(flows.__all__) == sorted(flows.PUBLIC)
    with pytest.raises(AttributeError):
        flows.no_such_name  # noqa: B018


def _hints(obj) -> dict[str, object]:
    """``obj``'s annotations evaluated, the modules its module imports for type checking only included."""
    import pandas
    import torch

    return typing.get_type_hints(obj, localns={"pd": pandas, "np": np, "torch": torch})


def _annotations(obj) -> dict[str, object]:
    """What ``obj`` takes and gives, by name: a function's parameters and return; a class's fields, its constructor's
    and each public method's and property's (``Class.member.parameter``)."""
    if not inspect.isclass(obj):
        return _hints(getattr(obj, "fn", obj))  # a flow: its function
    found, members = {}, {}
    if issubclass(obj, pydantic.BaseModel):
        found |= {name: field.annotation for name, field in obj.model_fields.items()}
    elif dataclasses.is_dataclass(obj) or issubclass(obj, tuple) or typing.is_typeddict(obj):
        found |= _hints(obj)  # the fields, which its constructor takes
    elif "__init__" in vars(obj):
        members["__init__"] = obj.__init__
    for name, member in vars(obj).items():
        function = member.fget if isinstance(member, property) else getattr(member, "__func__", member)
        if not name.startswith("_") and inspect.isfunction(function):
            members[name] = function
    for name, function in members.items():
        found |= {f"{name}.{key}": hint for key, hint in _hints(function).items()}
    return found


def _project_types(hint) -> set[type]:
    """The classes of this project that ``hint`` names, however nested (unions, generics, Annotated, Unpack)."""
    if inspect.isclass(hint) and hint.__module__.split(".")[0] in ("flows", "tasks"):
        return {hint}
    origin = typing.get_origin(hint)
    found = _project_types(origin) if inspect.isclass(origin) else set()
    for argument in typing.get_args(hint):
        found |= _project_types(argument)
    return found


def test_every_type_a_public_name_takes_or_gives_is_public():
    """Followed through every public class's fields and methods: a caller never needs an import from inside."""
    public = {id(getattr(flows, name)) for name in flows.PUBLIC}
    missing = {}
    for name in flows.PUBLIC:
        obj = getattr(flows, name)
        for where, hint in _annotations(obj).items():
            if f"{name}.{where.split('.')[0]}" in STAGES_ONLY or f"{name}.{where}" in STAGES_ONLY:
                continue
            for kind in _project_types(hint):
                if id(kind) not in public:
                    missing[f"{kind.__module__}.{kind.__qualname__}"] = f"{name}.{where}"
    assert missing == {}, "not public, add to flows.PUBLIC: " + ", ".join(f"{k} ({v})" for k, v in missing.items())


def test_importing_flows_imports_neither_prefect_nor_torch():
    code = "import sys, flows; print(sorted({'prefect', 'torch'} & set(sys.modules)))"
    assert subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout == "[]\n"


def test_importing_flows_changes_no_environment_variable():
    """In a clean environment (a command line sets Prefect's settings where it starts a server:
    flows/temporary_server.py)."""
    from deployments.local import PROJECT_ROOT

    code = "import os; before = dict(os.environ); import flows; print(dict(os.environ) == before)"
    environment = {"PATH": os.environ["PATH"], "PYTHONPATH": str(PROJECT_ROOT)}
    imported = subprocess.run([sys.executable, "-c", code], env=environment, capture_output=True, text=True, check=True)
    assert imported.stdout == "True\n"


def test_an_old_import_names_its_public_replacement():
    for name, public in _MOVED.items():
        with pytest.raises(ImportError, match=f"use 'from flows import {public}'"):
            exec(f"from tasks import {name}")
        assert public in flows.PUBLIC, name
    from tasks import convert  # a package still imports as one

    assert convert.__name__ == "tasks.convert"


def test_the_old_registry_command_says_where_it_moved_in_one_line():
    from deployments.local import PROJECT_ROOT

    moved = subprocess.run(
        [sys.executable, "-m", "tasks.registry", "list"], cwd=PROJECT_ROOT, capture_output=True, text=True, check=False
    )
    assert moved.returncode == 2 and moved.stdout == ""
    assert moved.stderr == (
        "python -m tasks.registry: moved; the registry's command line is `image-classifier registry …` "
        "(or `python -m flows.registry …`), with the same arguments\n"
    )


@pytest.mark.integration  # torchrun
def test_the_stages_chain_from_images_to_a_served_answer_with_the_public_names_alone(tmp_path):
    """convert → split → check → untrained model → train (torchrun, 1 process, 1 epoch on 16 px colours) → score →
    evaluate → register → alias → resolve → the LoadedModel the endpoint serves, answering one image as scoring did."""
    from flows import (
        LoadedModel,
        ModelSpec,
        TrainingFolders,
        TrainingParams,
        check_training_data,
        convert_to_image_directory,
        evaluate_scores,
        launch_training,
        lineage,
        list_versions,
        register_model,
        resolve,
        score_images,
        set_alias,
        split_image_directory,
        write_untrained_model_directory,
    )
    from tests.helpers import write_class_folders

    images = convert_to_image_directory(write_class_folders(tmp_path / "photos", per_class=6), tmp_path / "images")
    train, validation = split_image_directory(images, tmp_path / "train", tmp_path / "validation", fraction=0.5)
    assert check_training_data(train, validation).classes == images.classes
    untrained = write_untrained_model_directory(tmp_path / "untrained", ModelSpec(architecture="resnet18"))
    folders = TrainingFolders(train.root, validation.root, untrained, tmp_path / "model")
    params = TrainingParams(epochs=1, batch_size=4, image_size=32, device="cpu")
    model_dir = launch_training(folders, params, log=lambda level, line: None)
    scores = score_images(model_dir, validation)
    evaluation = evaluate_scores(scores)
    assert evaluation.images == len(validation.records())

    registry = str(tmp_path / "registry")
    datasets = {"train": lineage(train.root), "validation": lineage(validation.root)}
    registration, _ = register_model(
        registry, "colours", model_dir, metrics=evaluation.figures(), params=params.model_dump(), datasets=datasets
    )
    set_alias(registry, "colours", "production", registration.version)
    assert list_versions(registry, "colours") == [registration.version]
    assert resolve(registry, "colours@production").version == registration.version

    served = LoadedModel.load("colours@production", registry)
    image = scores["image"][0]
    [answer] = served.predictions([image], served.probabilities([served.decode(validation.root / image)]))
    assert answer.label == scores["Scored Labels"][0]
    scored = [scores[f"Scored Probabilities_{name}"][0] for name in answer.probabilities]
    assert np.allclose(list(answer.probabilities.values()), scored, atol=1e-5)
