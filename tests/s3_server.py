"""The tests' S3 endpoint: moto's server, with its conditional writes made atomic as S3's are.

moto checks a PUT's ``If-None-Match``/``If-Match`` and then stores the object in a second step, with no lock
between them, on a threaded server: two racing exclusive creates of one key can both be answered 200. A CI run
met it once, two registrations each holding version 1's claim. S3 decides a conditional write atomically; the
lock here gives moto the same guarantee, so that the registry's races are tested against S3's behaviour, not
against a gap in the stand-in. Run as ``python -m tests.s3_server -H 127.0.0.1 -p PORT`` (moto.server's flags).
"""

from __future__ import annotations

import threading

from moto.s3.responses import S3Response
from moto.server import main

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
