"""Deployments of the flows, and the local Prefect services that tests and measurements start."""
