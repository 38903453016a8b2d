import errno

from tasks.storage.local_files import storage_cause


def test_a_full_disk_is_found_behind_the_error_torch_raises():
    try:
        try:
            raise OSError(errno.ENOSPC, "No space left on device")
        except OSError:
            raise RuntimeError("[enforce fail at inline_container.cc:672] . unexpected pos 3") from None
    except RuntimeError as error:
        assert storage_cause(error).errno == errno.ENOSPC
    assert storage_cause(RuntimeError("a bug")) is None and storage_cause(OSError(errno.ENOENT, "gone")) is None
