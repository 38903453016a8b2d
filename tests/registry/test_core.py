"""The registry contract, run against both backends: a local folder and the real HTTP S3 endpoint."""

import json
import os
import shutil

import pytest

from tasks.errors import InvalidModelNameError, ModelNotFoundError, PipelineInputError
from tasks.registry import (
    REGISTRATION_FILE,
    CorruptRegistryRecordError,
    ModelIntegrityError,
    fetch_model,
    list_versions,
    load_model,
    open_backend,
    read_aliases,
    read_registration,
    resolve,
    set_alias,
)
from tasks.storage.local_files import sha256_file
from tests.faulty_proxy import FaultyProxy
from tests.helpers import NAME, register_test_model


def test_references_and_aliases_resolve_and_move(registry, trained_model, tmp_path):
    for _ in range(3):
        register_test_model(registry, trained_model)
    assert resolve(registry, NAME).version == 3 and resolve(registry, f"{NAME}/2").version == 2

    set_alias(registry, NAME, "production", 1)
    set_alias(registry, NAME, "staging", 3)
    assert resolve(registry, f"{NAME}@production").version == 1
    moved = set_alias(registry, NAME, "production", 2)
    assert (moved.version, moved.previous_version) == (2, 1)
    assert {a: r.version for a, r in read_aliases(registry, NAME).items()} == {"production": 2, "staging": 3}
    assert load_model(f"{NAME}@production", registry, tmp_path / "cache").classes == ["blue", "green", "red"]

    with pytest.raises(ModelNotFoundError, match=r"no alias 'canary'.*\['production', 'staging'\]"):
        resolve(registry, f"{NAME}@canary")
    with pytest.raises(ModelNotFoundError, match=r"no version 9.*\[1, 2, 3\]"):
        resolve(registry, f"{NAME}/9")
    with pytest.raises(ModelNotFoundError):
        set_alias(registry, NAME, "production", 9)
    with pytest.raises(ModelNotFoundError, match=f"no model named 'other' in .*; models: {NAME}$"):
        resolve(registry, "other")
    for typo in (f"{NAME}x", f"{NAME}x@production", f"{NAME}x/1"):  # not "has no alias": there is no such model
        with pytest.raises(ModelNotFoundError, match=f"no model named '{NAME}x' .*did you mean '{NAME}'"):
            resolve(registry, typo)


def test_references_and_names_are_checked(tmp_path, trained_model):
    for bad in ("", "Digits", "../escape", "a/b", "x" * 101, "digits\n", "digits\n../x"):
        with pytest.raises(InvalidModelNameError):
            register_test_model(tmp_path, trained_model, name=bad)
    for bad in ("production\n", "prod\nx"):
        with pytest.raises(InvalidModelNameError):
            register_test_model(tmp_path, trained_model, promote_to=bad)
        with pytest.raises(InvalidModelNameError):
            set_alias(tmp_path, NAME, bad, 1)
    for bad in ("digits/0", "digits@Prod", "digits@1x", "digits/1/2", "a@b@c"):
        with pytest.raises(InvalidModelNameError):
            resolve(tmp_path, bad)
    with pytest.raises(InvalidModelNameError, match="neither a model directory nor a registry reference"):
        load_model(str(tmp_path / "No Such Dir"), tmp_path, tmp_path / "cache")
    with pytest.raises(InvalidModelNameError):
        set_alias(tmp_path, NAME, "Production", 1)
    assert list(tmp_path.iterdir()) == []
    assert load_model(str(trained_model), tmp_path, tmp_path / "cache").root == trained_model


def tamper_record(registry, key, change):
    backend = open_backend(registry)
    record = json.loads(backend.read(key))
    change(record)
    backend.write(key, json.dumps(record).encode())


@pytest.mark.parametrize("bad_name", ["../../escaped.pt", "/tmp/escaped.pt", "logs/driver_log_0.txt"])
def test_a_record_naming_a_file_outside_the_allowed_set_is_refused(registry, trained_model, tmp_path, bad_name):
    register_test_model(registry, trained_model)
    key = f"{NAME}/1/{REGISTRATION_FILE}"
    tamper_record(registry, key, lambda r: r["files"].update({bad_name: "0" * 64}))
    cache = tmp_path / "deep" / "cache"
    location = open_backend(registry).location
    with pytest.raises(CorruptRegistryRecordError) as refused:
        fetch_model(registry, f"{NAME}/1", cache)
    assert f"{location}/{key} (model {NAME}, version 1) is refused: file {bad_name!r} is not one" in str(refused.value)
    assert not list(tmp_path.rglob("escaped.pt")) and not cache.exists()
    assert list_versions(registry, NAME) == [], "a refused record is no version"


def test_a_record_claiming_another_version_is_refused(registry, trained_model):
    register_test_model(registry, trained_model)
    register_test_model(registry, trained_model)
    tamper_record(registry, f"{NAME}/2/{REGISTRATION_FILE}", lambda r: r.update(version=1))
    with pytest.raises(CorruptRegistryRecordError, match=f"it says it is {NAME}/1"):
        read_registration(registry, NAME, 2)


def test_corrupt_records_are_typed_errors_and_left_out_of_latest(registry, trained_model, caplog):
    for accuracy in (0.7, 0.8):
        register_test_model(registry, trained_model, accuracy=accuracy)
    set_alias(registry, NAME, "production", 2)
    set_alias(registry, NAME, "staging", 1)
    backend = open_backend(registry)
    backend.write(f"{NAME}/2/{REGISTRATION_FILE}", b'{"name": "colours-resnet18", "vers')
    backend.write(f"{NAME}/aliases/staging.json", b"\x00not json")

    assert list_versions(registry, NAME) == [1], "listing skips it"
    assert f"{backend.location}/{NAME}/2/{REGISTRATION_FILE} (model {NAME}, version 2)" in caplog.text
    with pytest.raises(CorruptRegistryRecordError, match=rf"{NAME}/2/{REGISTRATION_FILE} \(model {NAME}, version 2"):
        resolve(registry, NAME)  # not quietly the older version 1
    assert resolve(registry, f"{NAME}/1").version == 1
    with pytest.raises(
        CorruptRegistryRecordError, match=r"registration.json \(model colours-resnet18, version 2\) is not a"
    ):
        resolve(registry, f"{NAME}@production")
    with pytest.raises(
        CorruptRegistryRecordError, match=r"aliases/staging.json \(model colours-resnet18, alias staging\)"
    ):
        resolve(registry, f"{NAME}@staging")
    assert set(read_aliases(registry, NAME)) == {"production"}
    assert not issubclass(CorruptRegistryRecordError, json.JSONDecodeError)
    assert issubclass(CorruptRegistryRecordError, PipelineInputError), "Prefect does not retry it"

    assert set_alias(registry, NAME, "staging", 1).previous_version is None, "setting an alias repairs it"
    assert resolve(registry, f"{NAME}@staging").version == 1
    assert register_test_model(registry, trained_model)[0].version == 3, "the corrupt version's number is not reused"


def test_a_local_version_whose_weights_changed_is_refused(tmp_path, trained_model):
    register_test_model(tmp_path / "registry", trained_model)
    cache = tmp_path / "cache"
    assert fetch_model(tmp_path / "registry", NAME, cache).classes == ["blue", "green", "red"]
    memo = json.loads((cache / ".sha256" / f"{NAME}.1.json").read_text())
    assert len(memo) == 5, "the hashes are memoised: the next fetch does not read the weights again"
    assert fetch_model(tmp_path / "registry", NAME, cache).classes == ["blue", "green", "red"]

    weights = tmp_path / "registry" / NAME / "1" / "model.pt"
    data = bytearray(weights.read_bytes())
    data[-1] ^= 0xFF
    stat = weights.stat()
    weights.write_bytes(bytes(data))
    os.utime(weights, ns=(stat.st_atime_ns, stat.st_mtime_ns))  # same size and mtime: the ctime still tells
    with pytest.raises(ModelIntegrityError, match=rf"{NAME}/1 does not hold what version 1 .* \(model.pt: sha256"):
        fetch_model(tmp_path / "registry", NAME, cache)


def test_a_tampered_s3_copy_is_downloaded_again_and_a_tampered_object_refused(s3_bucket, trained_model, tmp_path):
    registry = f"s3://{s3_bucket}/models"
    register_test_model(registry, trained_model)
    cache = tmp_path / "cache"
    weights = fetch_model(registry, NAME, cache).weights_path
    weights.write_bytes(b"tampered")
    assert sha256_file(fetch_model(registry, NAME, cache).weights_path) == sha256_file(trained_model / "model.pt")

    open_backend(registry).write(f"{NAME}/1/model.pt", b"replaced on S3")
    shutil.rmtree(cache)
    with pytest.raises(ModelIntegrityError, match=rf"s3://{s3_bucket}/models/{NAME}/1 does not hold"):
        fetch_model(registry, NAME, cache)
    assert not (cache / NAME / "1").exists()


def test_a_registry_fetch_reads_again_the_bodies_cut_off_mid_way(
    s3_bucket, s3_endpoint, trained_model, tmp_path, monkeypatch
):
    registry = f"s3://{s3_bucket}/models"
    register_test_model(registry, trained_model)
    with FaultyProxy(s3_endpoint, failure_rate=0.0, cut_rate=0.5, seed=2) as proxy:
        monkeypatch.setenv("AWS_ENDPOINT_URL", proxy.url)
        model = fetch_model(registry, NAME, tmp_path / "cache")
    for file_name in ("model.pt", "classes.json", "metrics.json"):
        assert sha256_file(model.root / file_name) == sha256_file(trained_model / file_name)
    assert proxy.counts["cut"] >= 2, proxy.counts


def test_the_registered_model_artifact_is_absolute_with_a_one_line_figure(tmp_path, trained_model, monkeypatch):
    from tasks.registry.card import registered_model_markdown

    monkeypatch.chdir(tmp_path)
    registration, location = register_test_model("relative-registry", trained_model, accuracy=0.98765)
    markdown, description = registered_model_markdown(registration, location, "accuracy")
    assert location == str(tmp_path / "relative-registry" / NAME / "1")
    assert description == f"{NAME} v1, accuracy 0.9877"
    assert f"Stored in `{location}`" in markdown and "| accuracy | 0.9877 |" in markdown
