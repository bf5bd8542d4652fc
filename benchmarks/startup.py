"""CLI start-up of two checkouts, interleaved (no suite: it times fresh processes): median wall seconds of N runs each."""
import os, statistics, subprocess, sys, time
roots = sys.argv[1:3]; n = int(sys.argv[3]) if len(sys.argv) > 3 else 5
cmds = {"--help": ["--help"], "info": ["info"], "memory list": ["memory", "list"], "pull (present)": ["pull"],
        "generate (1 token)": ["generate", "-p", "Hi", "--max-tokens", "1", "--temp", "0"]}
print(f"{'command':22s} " + "  ".join(f"{os.path.basename(r):>18s}" for r in roots))
for name, args in cmds.items():
    ts = {r: [] for r in roots}
    for _ in range(n):
        for r in roots:
            t = time.perf_counter()
            p = subprocess.run([os.path.join(r, ".venv/bin/python"), "-m", "mlotspark", *args], cwd=r, capture_output=True)
            ts[r].append(time.perf_counter() - t)
            assert p.returncode == 0, p.stderr[-300:]
    print(f"{name:22s} " + "  ".join(f"{statistics.median(ts[r]):7.2f} s (min {min(ts[r]):.2f})" for r in roots), flush=True)
