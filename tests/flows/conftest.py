"""What the flow tests that start a stack of their own (tests/flows/nodes_stack.py) share."""

import pytest

from tests.helpers import s3_test_bucket


@pytest.fixture(scope="module")
def s3_work(stack):
    """A new bucket on the stack's S3 server for work_dir and registry (its URI), this process's S3 settings
    pointing at the server; each test file's own ``stack``."""
    with pytest.MonkeyPatch.context() as patch:
        for key in ("AWS_ENDPOINT_URL", "AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_DEFAULT_REGION"):
            patch.setenv(key, stack.env[key])
        with s3_test_bucket("work") as bucket:
            yield f"s3://{bucket}"
