"""Moved to tasks/outages/prefect_events.py (Prefect's events client: the Prefect rule, docs/development.md); this
name answers until flows/cli.py imports it from there (issue 55, item 3)."""

from tasks.outages.prefect_events import events_wait_for_the_server

__all__ = ["events_wait_for_the_server"]
