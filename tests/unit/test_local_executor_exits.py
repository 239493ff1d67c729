"""A rank of the local executor that exits between the executor's first look at its process and the
final "is every rank gone?" check of the same poll is still classified by how it exited: an entrypoint's
clean exit is a success and an error exit the user's failure, never a gang "lost without reporting"."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from trainyard.executors.local import LocalExecutor, _Gang, _Rank
from trainyard.runtime.events import EventTail


class ExitsOnSecondLook:
    """A process that is still running at the first ``poll()`` and has exited with ``code`` at the next."""

    def __init__(self, code: int):
        self.code = code
        self.looks = 0

    def poll(self) -> int | None:
        self.looks += 1
        return None if self.looks == 1 else self.code


def gang_with(tmp_path: Path, proc: ExitsOnSecondLook) -> _Gang:
    (tmp_path / "rank-0.log").write_text("--- attempt 0 rank 0 ---\nTraceback: boom\n")
    rank = _Rank(0, 123456, proc, EventTail(tmp_path / "events-a0-r0.jsonl"))  # type: ignore[arg-type]
    rank.last_seen_s = time.time()
    return _Gang("job-race", 0, tmp_path, 1, [rank], time.time(), entrypoint=True)


@pytest.mark.parametrize(
    ("code", "kind"),
    [(0, "succeeded"), (1, "failed")],
)
def test_an_exit_between_the_two_looks_of_one_poll_keeps_its_meaning(
    tmp_path: Path, code: int, kind: str
) -> None:
    ex = LocalExecutor(warm_start=False, gpus=[])
    ex._gangs["job-race"] = gang_with(tmp_path, ExitsOnSecondLook(code))
    events = ex.poll()
    assert [e.kind for e in events] == [kind], [(e.kind, e.data) for e in events]
    if kind == "failed":
        assert events[0].data["classification"] == "user"
        assert "Traceback: boom" in events[0].data["traceback_tail"]
    assert "job-race" not in ex._gangs
