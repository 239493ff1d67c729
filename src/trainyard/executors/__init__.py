"""Executor backends: the protocol (base), local subprocesses (local) and a Ray cluster (ray)."""

from trainyard.executors.base import (
    Executor,
    ExecutorEvent,
    LaunchRequest,
    RestartPolicy,
    WorkerInfo,
)

__all__ = ["Executor", "ExecutorEvent", "LaunchRequest", "RestartPolicy", "WorkerInfo"]
