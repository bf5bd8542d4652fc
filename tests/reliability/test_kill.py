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
    for problem in ("unreadable", "lost", "lost_facts", "snapshots_bad", "snapshots_refused", "prefix_refused"):
        assert not totals.get(problem), (problem, totals)
    assert totals.get("snapshots_ok"), totals
    # Leftover temp files of killed writers are cleared by the next writes (or are few).
    assert len(temp_leftovers(home)) <= count(4, 200), temp_leftovers(home)


def test_batch_output_file_survives_kills_and_resumes(tiny_gguf, tmp_path):
    """``generate --prompts --output`` killed at random instants, then run again until
    done: every prompt's result exactly once, every line whole."""
    import json
    import os
    import signal
    import subprocess
    import sys
    import time

    from rel_common import child_env, rng

    r = rng("batch")
    n = count(12, 120)  # enough prompts that every kill lands while results are being written
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text("".join(json.dumps({"prompt": f"Say {i}."}) + "\n" for i in range(n)))
    output = tmp_path / "out.jsonl"
    cmd = [sys.executable, "-m", "mlotspark", "generate", "--model", str(tiny_gguf), "--prompts", str(prompts),
           "--output", str(output), "--max-tokens", "24", "--temp", "0", "--max-batch", "2"]
    kills = 0
    for life in range(count(1, 20) + 50):
        proc = subprocess.Popen(cmd, env=child_env(tmp_path / "home"), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        if kills < count(1, 20):
            # Wait for the first new result line, then a uniform instant.
            size = output.stat().st_size if output.exists() else 0
            deadline = time.monotonic() + 120
            while proc.poll() is None and time.monotonic() < deadline and (output.stat().st_size if output.exists() else 0) == size:
                time.sleep(0.02)
            time.sleep(r.uniform(0, 0.3))
            if proc.poll() is None:
                os.kill(proc.pid, signal.SIGKILL)
                kills += 1
        _, err = proc.communicate(timeout=300)
        assert b"Traceback" not in err, err.decode()
        if proc.returncode == 0:
            break
    lines = output.read_text().splitlines()
    keys = [(json.loads(ln)["index"], json.loads(ln)["sequence"]) for ln in lines]
    record("batch_kill", kills=kills, lines=len(lines), duplicates=len(keys) - len(set(keys)))
    assert sorted(keys) == [(i, 0) for i in range(n)], keys
