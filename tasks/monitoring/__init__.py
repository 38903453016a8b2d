"""The served model watched (docs/monitoring.md): what the endpoint answers, recorded off the request path
(records.py: the records and the folder they are published into; recorder.py: the endpoint's bounded, never-blocking
writer). Imports no Prefect outside its prefect_tasks.py."""
