"""Secrets in files only their owner may read: refused when others may, created 0600, found where configured."""

import stat

import pytest

from tasks.storage.secrets import SecretFileError, config_dir, create_secret, is_loopback, read_secret


def test_a_created_secret_is_readable_by_its_owner_only_and_read_back(tmp_path):
    path = tmp_path / "new" / "token"
    assert read_secret(path) is None, "no file: no secret"
    assert create_secret(path, "s3cret") == "s3cret"
    assert stat.S_IMODE(path.stat().st_mode) == 0o600 and stat.S_IMODE(path.parent.stat().st_mode) == 0o700
    assert read_secret(path) == "s3cret"
    with pytest.raises(FileExistsError):  # never overwritten
        create_secret(path, "another")


def test_a_secret_others_may_read_is_refused_with_the_command_that_fixes_it(tmp_path):
    path = tmp_path / "token"
    path.write_text("s3cret\n")
    path.chmod(0o644)
    with pytest.raises(SecretFileError) as refused:
        read_secret(path)
    assert str(refused.value) == (
        f"{path} may be read by others (mode 0644): run `chmod 600 {path}`, and change the secret in it if others "
        "could have read it"
    )


def test_an_empty_secret_file_is_refused(tmp_path):
    path = tmp_path / "token"
    path.write_text("  \n")
    path.chmod(0o600)
    with pytest.raises(SecretFileError, match="is empty: write the secret in it, or remove it"):
        read_secret(path)


def test_the_secrets_folder_is_the_configured_one_else_xdgs_else_home(monkeypatch, tmp_path):
    monkeypatch.delenv("IMAGE_CLASSIFIER_CONFIG", raising=False)
    monkeypatch.delenv("XDG_CONFIG_HOME", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert config_dir() == tmp_path / "home" / ".config" / "image-classifier"
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "xdg"))
    assert config_dir() == tmp_path / "xdg" / "image-classifier"
    monkeypatch.setenv("IMAGE_CLASSIFIER_CONFIG", str(tmp_path / "mine"))
    assert config_dir() == tmp_path / "mine"


@pytest.mark.parametrize(
    ("host", "loopback"),
    [
        ("localhost", True),
        ("127.0.0.1", True),
        ("::1", True),
        ("0.0.0.0", False),
        ("10.0.0.5", False),
        ("gpu-a", False),
    ],
)
def test_only_loopback_addresses_count_as_loopback(host, loopback):
    assert is_loopback(host) is loopback
