"""The local registry backend: a version record created once, compare-and-swap for what changes, keys that stay
inside the registry, and writes in progress never listed."""

import threading

import pytest

from tasks.registry.backends import LocalBackend, swap


def test_a_record_is_created_once_and_a_second_create_is_refused(tmp_path):
    backend = LocalBackend(tmp_path)
    assert backend.read("colours/1/registration.json") is None
    assert backend.create_exclusive("colours/1/registration.json", b"first")
    assert not backend.create_exclusive("colours/1/registration.json", b"second")
    assert backend.read("colours/1/registration.json") == b"first"


@pytest.mark.parametrize("key", ["../outside", "colours/../../outside", "colours//1", "colours/./1", "a\\b"])
def test_a_key_that_would_leave_the_registry_is_refused(tmp_path, key):
    with pytest.raises(ValueError, match="would leave"):
        LocalBackend(tmp_path / "registry").write(key, b"x")
    assert not (tmp_path / "outside").exists()


def test_listing_gives_the_keys_under_a_folder_and_never_a_write_in_progress(tmp_path):
    backend = LocalBackend(tmp_path)
    for key in ("colours/1/model.pt", "colours/2/model.pt", "digits/1/model.pt"):
        backend.write(key, b"weights")
    (tmp_path / "colours" / "2" / ".model.pt.tmp-123").write_bytes(b"half")
    assert backend.list_keys("colours") == ["colours/1/model.pt", "colours/2/model.pt"]
    assert backend.list_keys("nothing-here") == []
    backend.delete("colours/1/model.pt")
    backend.delete("colours/1/model.pt")  # already gone: no error
    assert backend.list_keys("") == ["colours/2/model.pt", "digits/1/model.pt"]


def test_a_replace_is_refused_when_the_record_changed_since_it_was_read(tmp_path):
    backend = LocalBackend(tmp_path)
    assert backend.replace_if("k", b"one", None)  # None: expected absent
    _, tag = backend.read_tagged("k")
    assert not backend.replace_if("k", b"two", None)
    assert backend.replace_if("k", b"two", tag)
    assert not backend.replace_if("k", b"three", tag), "the tag read before the change no longer holds"
    assert backend.read("k") == b"two"


def test_swap_judges_again_when_another_writer_came_first_and_loses_no_change(tmp_path):
    """Eight writers adding one tag each at once: every tag is kept."""
    backend = LocalBackend(tmp_path)

    def add(tag: str) -> None:
        swap(backend, "tags", lambda current: b",".join(filter(None, [current, tag.encode()])))

    writers = [threading.Thread(target=add, args=(f"t{i}",)) for i in range(8)]
    for writer in writers:
        writer.start()
    for writer in writers:
        writer.join()
    assert sorted(backend.read("tags").split(b",")) == [f"t{i}".encode() for i in range(8)]


def test_swap_leaves_the_record_alone_when_the_change_says_none(tmp_path):
    backend = LocalBackend(tmp_path)
    backend.write("k", b"kept")
    assert swap(backend, "k", lambda current: None) is None
    assert backend.read("k") == b"kept"
