"""Kill at any instant: 0 unreadable stores, 0 lost completed turns (issue 16 §1)."""

from __future__ import annotations

from rel_common import count, record, temp_leftovers
from rel_kill import run_kills


def test_sigkill_inside_writes_and_at_random_instants_loses_nothing(tiny_gguf, tmp_path):
    home = tmp_path / "home"
    totals = run_kills(tiny_gguf, home, lives=count(4, 200))
    record("kill", **totals, leftovers=len(temp_leftovers(home)))
    assert totals["kills"] == count(4, 200) and not totals.get("crashed"), totals
    assert totals["completed"] >= 1, totals
    for problem in ("unreadable", "lost", "lost_facts", "snapshots_bad", "prefix_refused"):
        assert not totals.get(problem), (problem, totals)
    assert totals.get("snapshots_ok"), totals
    # Leftover temp files of killed writers are cleared by the next writes (or are few).
    assert len(temp_leftovers(home)) <= count(4, 200), temp_leftovers(home)
