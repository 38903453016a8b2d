"""The tests' S3 endpoint: moto's server, with its conditional writes made atomic as S3's are.

moto checks a PUT's ``If-None-Match``/``If-Match`` and then stores the object in a second step, with no lock
between them, on a threaded server: two racing exclusive creates of one key can both be answered 200. A CI run
met it once, two registrations each holding version 1's claim. S3 decides a conditional write atomically; the
lock here gives moto the same guarantee, so that the registry's races are tested against S3's behaviour, not
against a gap in the stand-in.

moto keeps an object in memory up to a buffer size (8 MB by default) and writes larger ones to a temporary file:
the training tests' checkpoints (90 MB for resnet18 with its optimizer state, stored after every epoch) made that
write about 40% of the endpoint's CPU (five checkpoints and models, 670 MB, took it 4.5 CPU-s to take in with the
default buffer and 2.4 with 256 MB; the kernel's writeback of the file came on top). Each test empties its
buckets when it ends: memory holds the objects of the tests running at the moment (hundreds of MB at most).

Run as ``python -m tests.s3_server -H 127.0.0.1 -p PORT`` (moto.server's flags).
"""

from __future__ import annotations

import os
import threading

from moto.s3.responses import S3Response
from moto.server import main

os.environ.setdefault("MOTO_S3_DEFAULT_KEY_BUFFER_SIZE", str(256 << 20))

_conditional = threading.Lock()
_put_object = S3Response.put_object


def _atomic_put_object(self: S3Response):
    if self.headers.get("If-None-Match") or self.headers.get("If-Match"):
        with _conditional:
            return _put_object(self)
    return _put_object(self)


S3Response.put_object = _atomic_put_object

if __name__ == "__main__":
    main()
