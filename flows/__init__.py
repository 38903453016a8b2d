"""Prefect flows: they compose the stages in tasks/ and hold no logic of their own."""
