"""What the train task hands Prefect's logger: torchrun's lines made safe (tasks/launch/torchrun_output.py)."""

import io
import uuid
from datetime import datetime, timezone

GLOO_ERROR = (
    "RuntimeError: [/__w/pytorch/pytorch/third_party/gloo/gloo/transport/tcp/pair.cc:545] Read error "
    "[127.0.0.1]:54500: Connection reset by peer."
)


def test_a_training_line_with_a_closing_bracket_tag_does_not_stop_prefect_s_watch():
    """`prefect deployment run --watch` prints each log message as rich markup (Prefect's FlowRunFormatter): the
    gloo error a rank prints when its peer dies stopped the watch with a MarkupError while the run went on."""
    import pytest
    from prefect.cli.flow_runs_watching import FlowRunFormatter
    from prefect.client.schemas.objects import Log
    from rich.console import Console
    from rich.errors import MarkupError

    from tasks.launch.torchrun_output import watchable

    def shown(message: str) -> str:
        log = Log(
            name="prefect.task_runs",
            level=40,
            message=message,
            timestamp=datetime.now(timezone.utc),
            flow_run_id=uuid.uuid4(),
        )
        console = Console(file=io.StringIO(), width=400)
        console.print(FlowRunFormatter().format(log))
        return console.file.getvalue()

    with pytest.raises(MarkupError):
        shown(GLOO_ERROR)
    lines: list[str] = []
    watchable(lambda level, line: lines.append(line))(40, GLOO_ERROR)
    assert GLOO_ERROR in shown(lines[0])
