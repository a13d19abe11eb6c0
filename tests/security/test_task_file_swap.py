"""Issue 35 §8 (the agent's task file): the file `Boundary.resolve_read` checked is read
without following any link, so swapping it (or a folder on its way) for a link to a file
outside after the check gives an error, never the outside file. The swap is made here
between check and read, deterministically, in place of the race the review won 25 times
in 300."""

from __future__ import annotations

from pathlib import Path

import pytest

from perdure.agent.loop import AgentFailed, task_text
from perdure.agent.tools import Boundary


def test_a_task_file_swapped_for_a_link_after_its_check_is_not_read(tmp_path: Path) -> None:
    inbox, outside = tmp_path / "inbox", tmp_path / "outside"
    (inbox / "sub").mkdir(parents=True)
    outside.mkdir()
    (outside / "shadow").write_text("root:secret-hash")
    task = inbox / "sub" / "task.txt"
    task.write_text("Please summarise this.")
    boundary = Boundary(read_paths=[inbox])
    checked = boundary.resolve_read(str(task))
    assert task_text(checked, 1000) == "Please summarise this."
    task.unlink()
    task.symlink_to(outside / "shadow")  # the file swapped after its check
    with pytest.raises(AgentFailed, match="cannot read"):
        task_text(checked, 1000)
    task.unlink()
    (inbox / "sub").rename(inbox / "old")
    (inbox / "sub").symlink_to(outside)  # a folder on the way swapped instead
    (outside / "task.txt").write_text("root:secret-hash")
    with pytest.raises(AgentFailed, match="cannot read"):
        task_text(checked, 1000)
