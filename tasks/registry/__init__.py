"""The model registry: versioned, aliased trained models on a local folder (default) or ``s3://bucket/prefix``.

    (the layout: names, references, records and their keys is ``tasks/contracts/registry_layout.py``)
    backends.py      the storage interface and the local-disk backend; s3.py the S3 one; locations.py picks one
    core.py          read, list, resolve references, aliases by compare-and-swap
    registering.py   register: claim a version, upload, commit (all or nothing)
    promotion.py     champion/challenger: the policy, the rule, the judgement, the alias move, a person's answer
    status.py        a version's changeable state (tags, archived, deleted, approval) by compare-and-swap
    manage.py        what people do to a registry: list models, show, tag, archive, delete, search
    fetch.py         a version as a local ModelDirectory, its files checked (integrity.py: sha256, memoised)
    card.py          the pages in markdown: model card, registered version, promotion verdict, reviewer's view
    __main__.py      ``python -m tasks.registry`` says in one line that the command line moved to flows/registry.py
    prefect_tasks.py the Prefect tasks: register, resolve_model, the approval pause and decide_on_promotion,
                     publishing the model card

Importing this package (or ``core``) imports neither Prefect nor torch: a registration is cheap to run
from any process.
"""

from __future__ import annotations

from tasks.contracts.registry_layout import (
    CLAIM_FILE,
    REGISTRATION_FILE,
    AliasRecord,
    DatasetLineage,
    ModelReference,
    Promotion,
    Registration,
    check_model_name,
    default_model_name,
    parse_reference,
)
from tasks.errors import CorruptRegistryRecordError, ModelIntegrityError
from tasks.registry.backends import LocalBackend, RegistryBackend
from tasks.registry.core import (
    lineage,
    list_versions,
    read_aliases,
    read_registration,
    resolve,
    set_alias,
    unset_alias,
)
from tasks.registry.fetch import fetch_model, load_model
from tasks.registry.locations import open_backend
from tasks.registry.promotion import PromotionPolicy, PromotionRule, challenge
from tasks.registry.registering import register_model

__all__ = [
    "CLAIM_FILE",
    "REGISTRATION_FILE",
    "AliasRecord",
    "CorruptRegistryRecordError",
    "DatasetLineage",
    "LocalBackend",
    "ModelIntegrityError",
    "ModelReference",
    "Promotion",
    "PromotionPolicy",
    "PromotionRule",
    "Registration",
    "RegistryBackend",
    "challenge",
    "check_model_name",
    "default_model_name",
    "fetch_model",
    "lineage",
    "list_versions",
    "load_model",
    "open_backend",
    "parse_reference",
    "read_aliases",
    "read_registration",
    "register_model",
    "resolve",
    "set_alias",
    "unset_alias",
]
