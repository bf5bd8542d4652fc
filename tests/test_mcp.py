"""MCP tools run for the model: the servers file, the hub (the real ``mcp-server-time`` and a
server written with the ``mcp`` SDK, tests/mcp_test_server.py), the approval answers, the
loop's bound, the Responses items, and one turn on the real Qwen through a named tool."""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import psutil
import pytest

from mlotspark import OptionError
from mlotspark.results import GenerationResult, GenerationStats, ToolCall
from mlotspark.tools import Approval, McpHub, load_mcp_config, run_turn
from mlotspark.tools.mcp_config import parse_mcp_config
from mlotspark.tools.responses_items import mcp_request, run_mcp_tools

TEST_SERVER = str(Path(__file__).with_name("mcp_test_server.py"))
TIME = {"command": sys.executable, "args": ["-m", "mcp_server_time", "--local-timezone", "UTC"]}
MINE = {"command": sys.executable, "args": [TEST_SERVER]}


def _children() -> set[int]:
    return {c.pid for c in psutil.Process().children(recursive=True)}


def _ends(pid: int, within_s: float = 10.0) -> bool:
    """Whether process ``pid`` is gone (or a zombie) within ``within_s``: a process that
    called ``_exit`` has closed its pipes (so the hub saw the crash) a moment before the
    kernel marks it exited, so checking once right after the call races that moment."""
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline:
        try:
            if psutil.Process(pid).status() == psutil.STATUS_ZOMBIE:
                return True
        except psutil.NoSuchProcess:
            return True
        time.sleep(0.05)
    return False


@pytest.fixture(scope="module")
def hub():
    """The time server and two copies of the test server (their tool names clash)."""
    before = _children()
    h = McpHub(parse_mcp_config({"mcpServers": {"time": TIME, "a": MINE, "b": MINE}}),
               call_timeout_s=1.0, max_result_chars=200).start()
    yield h
    h.close()
    assert not (_children() - before), "a server's process outlived the hub"


# -- the servers file -------------------------------------------------------------------
def test_config_reads_the_shared_shape(tmp_path):
    p = tmp_path / "mcp.json"
    p.write_text(json.dumps({"mcpServers": {"time": {**TIME, "env": {"TZ": "UTC"}},
                                            "web": {"url": "http://127.0.0.1:9000/mcp"},
                                            "off": {"command": "x", "disabled": True}}}))
    servers = load_mcp_config(p)
    assert list(servers) == ["time", "web"]
    assert servers["time"].args == tuple(TIME["args"]) and servers["time"].env == {"TZ": "UTC"}
    assert servers["web"].transport == "http"


@pytest.mark.parametrize("doc, named", [
    ({"servers": {}}, "mcpServers"),
    ({"mcpServers": {"t": {"args": []}}}, "mcpServers.t"),
    ({"mcpServers": {"t": {"command": "x", "args": "-m y"}}}, "mcpServers.t.args"),
    ({"mcpServers": {"t": {"command": "x", "env": {"A": 1}}}}, "mcpServers.t.env"),
    ({"mcpServers": {"t": {"url": "https://example.com/mcp"}}}, "mcpServers.t.url"),
    ({"mcpServers": {"bad name": {"command": "x"}}}, "'bad name'"),
])
def test_a_bad_config_names_the_key(doc, named, tmp_path):
    p = tmp_path / "mcp.json"
    p.write_text(json.dumps(doc))
    with pytest.raises(OptionError) as e:
        load_mcp_config(p)
    assert named in str(e.value) and str(p) in str(e.value) and "\n" not in str(e.value)


def test_a_missing_or_broken_file_is_one_line(tmp_path):
    with pytest.raises(OptionError, match="cannot read MCP config"):
        load_mcp_config(tmp_path / "none.json")
    (tmp_path / "bad.json").write_text("{")
    with pytest.raises(OptionError, match="is not JSON"):
        load_mcp_config(tmp_path / "bad.json")


# -- the hub ------------------------------------------------------------------------------
def test_tools_are_listed_and_clashing_names_prefixed(hub):
    names = [t.name for t in hub.tools]
    assert {"get_current_time", "convert_time"} <= set(names)  # unique: kept as the server names them
    assert {"a__echo", "b__echo", "a__hang", "b__crash"} <= set(names) and "echo" not in names
    echo = next(t for t in hub.tools if t.name == "a__echo")
    assert (echo.server, echo.tool) == ("a", "echo")
    assert echo.openai()["function"]["parameters"]["properties"]["text"]["type"] == "string"
    assert [s["name"] for s in hub.describe()] == ["time", "a", "b"] and not hub.errors


def test_the_real_time_server_answers(hub):
    out = hub.call("get_current_time", {"timezone": "Asia/Tokyo"})
    assert out.error is None and json.loads(out.output)["timezone"] == "Asia/Tokyo"


def test_an_error_result_and_an_unknown_tool_are_one_line(hub):
    out = hub.call("get_current_time", {"timezone": "Not/AZone"})
    assert out.error and "Not/AZone" in out.error and "\n" not in out.error and out.text.startswith("error: ")
    assert "no tool 'nope'" in hub.call("nope", {}).error


def test_results_are_capped_and_say_so(hub):
    out = hub.call("a__long", {"chars": 5000})
    assert out.cut and out.full_chars == 5000
    assert out.output.startswith("x" * 200) and "[result cut at 200 of 5,000 characters]" in out.output
    assert not hub.call("a__long", {"chars": 50}).cut


def test_a_hung_call_is_bounded_and_the_server_lives_on(hub):
    out = hub.call("a__hang", {}, timeout_s=0.3)
    assert out.error == "a: hang timed out after 0.3 s"
    assert hub.call("a__echo", {"text": "still here"}).output == "echo: still here"


def test_garbage_on_the_stream_does_not_break_the_server(hub):
    assert hub.call("a__garbage", {}).output == "answered after garbage"
    assert hub.call("a__echo", {"text": "ok"}).output == "echo: ok"


def test_a_crash_mid_call_is_one_line_and_the_server_is_marked_gone(hub):
    pid = int(hub.call("b__pid", {}).output)
    out = hub.call("b__crash", {})
    assert out.error.startswith("b: crash failed:") and "crashing on purpose" in out.error and "\n" not in out.error
    assert _ends(pid), f"the crashed server's process {pid} still runs"
    after = hub.call("b__echo", {"text": "x"})
    assert after.error and "exited" in after.error
    assert {s["name"]: s["running"] for s in hub.describe()}["b"] is False
    assert hub.call("a__echo", {"text": "a is fine"}).output == "echo: a is fine"


def test_a_server_that_cannot_start_is_named_and_the_others_run(tmp_path):
    cfg = parse_mcp_config({"mcpServers": {"gone": {"command": str(tmp_path / "no-such-program")}, "a": MINE}})
    with McpHub(cfg, start_timeout_s=20) as h:
        assert "gone" in h.errors and h.errors["gone"].startswith("did not start")
        assert [t.name for t in h.tools if t.name == "echo"] == ["echo"]  # no clash with a server that is not running


def test_a_server_that_never_answers_the_handshake_is_bounded(tmp_path):
    silent = tmp_path / "silent.py"
    silent.write_text("import time\ntime.sleep(600)\n")
    before = _children()
    h = McpHub(parse_mcp_config({"mcpServers": {"mute": {"command": sys.executable, "args": [str(silent)]}}}),
               start_timeout_s=0.5).start()
    try:
        assert h.errors["mute"] == "did not start: timed out" and h.tools == []
    finally:
        h.close()
    assert not (_children() - before)


def test_a_streamable_http_server_on_loopback(tmp_path):
    import socket
    import subprocess

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc = subprocess.Popen([sys.executable, TEST_SERVER, "--http", str(port)], stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    try:
        for _ in range(600):  # until it listens (bounded: 600 tries of 0.05 s)
            with socket.socket() as s:
                if s.connect_ex(("127.0.0.1", port)) == 0:
                    break
            if proc.poll() is not None:
                break
            time.sleep(0.05)
        cfg = parse_mcp_config({"mcpServers": {"web": {"url": f"http://127.0.0.1:{port}/mcp"}}})
        with McpHub(cfg, start_timeout_s=20) as h:
            assert h.describe()[0]["transport"] == "http" and not h.errors
            assert h.call("echo", {"text": "over http"}).output == "echo: over http"
    finally:
        proc.terminate()
        proc.wait(10)


def test_close_ends_every_child(tmp_path):
    before = _children()
    h = McpHub(parse_mcp_config({"mcpServers": {"a": MINE}})).start()
    pid = int(h.call("echo", {"text": "x"}) and h.call("pid", {}).output)
    assert pid in _children()
    h.close()
    assert pid not in _children() and not (_children() - before)
    assert h.call("echo", {"text": "x"}).error == "the MCP servers are closed"
    h.close()  # idempotent


# -- approval and the loop (a scripted engine: the loop's logic, not the model's) --------
class ScriptedEngine:
    """Answers each ``generate`` with the next scripted reply; records what it was given."""

    def __init__(self, replies):
        self.replies = list(replies)
        self.seen = []

    def generate(self, messages, **options):
        self.seen.append((list(messages), options))
        text, calls = self.replies.pop(0) if self.replies else ("done", [])
        return GenerationResult(text, [], GenerationStats(), tool_calls=calls)


def _call(name, i=0, **args):
    return ToolCall(f"call_{i}", name, args)


def test_approval_answers_are_remembered():
    asked = []
    answers = iter(["once", "always", "never"])
    ap = Approval(lambda call: asked.append(call.name) or next(answers))
    assert ap.allows(_call("t1"))  # once: runs, asks again next time
    assert ap.allows(_call("t1"))  # always
    assert ap.allows(_call("t1")) and asked == ["t1", "t1"]
    assert not ap.allows(_call("t2")) and not ap.allows(_call("t2")) and asked == ["t1", "t1", "t2"]
    with pytest.raises(OptionError, match="invalid approval 'maybe'"):
        Approval(lambda call: "maybe").allows(_call("t3"))


def test_the_loop_runs_calls_feeds_results_and_answers(hub):
    eng = ScriptedEngine([("", [_call("a__echo", text="ping")]), ("The tool said ping.", [])])
    events = []
    turn = run_turn(eng, [{"role": "user", "content": "echo ping"}], hub, on_event=lambda e: events.append(e.kind),
                    tool_choice={"type": "function", "function": {"name": "a__echo"}}, max_tokens=20)
    assert turn.text == "The tool said ping." and not turn.bounded
    assert [m["role"] for m in turn.messages] == ["assistant", "tool", "assistant"]
    assert turn.messages[1]["content"] == "echo: ping" and turn.messages[1]["tool_call_id"] == "call_0"
    second_messages, second_options = eng.seen[1]
    assert second_messages[-1]["content"] == "echo: ping" and second_options["tool_choice"] == "auto"
    assert eng.seen[0][1]["tool_choice"]["function"]["name"] == "a__echo"
    assert {"a__echo", "get_current_time"} <= {t["function"]["name"] for t in eng.seen[0][1]["tools"]}
    assert events == ["reply", "call", "result", "reply"]


def test_a_declined_tool_is_not_run_and_the_model_is_told(hub):
    eng = ScriptedEngine([("", [_call("a__pid")]), ("ok", [])])
    turn = run_turn(eng, [{"role": "user", "content": "pid?"}], hub, approve=Approval(lambda c: "never"))
    assert turn.outcomes[0].error == "the user declined to run a__pid"
    assert turn.messages[1]["content"] == "error: the user declined to run a__pid"


def test_a_model_that_keeps_calling_a_declined_tool_still_ends(hub):
    asked = []
    eng = ScriptedEngine([("", [_call("a__pid", i)]) for i in range(20)])
    turn = run_turn(eng, [{"role": "user", "content": "pid?"}], hub, max_calls=3,
                    approve=Approval(lambda c: asked.append(c.id) or "never"))
    assert asked == ["call_0"] and turn.bounded and len(eng.seen) == 4  # asked once; 3 answered, then the last
    assert [o.error for o in turn.outcomes] == ["the user declined to run a__pid"] * 3
    assert "tools" not in eng.seen[-1][1]


def test_the_loop_is_bounded(hub):
    looping = [("", [_call("a__echo", i, text=str(i))]) for i in range(10)]
    eng = ScriptedEngine(looping)
    turn = run_turn(eng, [{"role": "user", "content": "loop"}], hub, max_calls=2)
    assert turn.bounded and [o.output for o in turn.outcomes] == ["echo: 0", "echo: 1"]
    assert len(eng.seen) == 3 and "tools" not in eng.seen[-1][1]  # the last answer is given without tools
    two = ScriptedEngine([("", [_call("a__echo", 0, text="0"), _call("a__echo", 1, text="1")]), ("done", [])])
    turn = run_turn(two, [{"role": "user", "content": "loop"}], hub, max_calls=1)  # two calls in one reply
    assert [o.error for o in turn.outcomes] == [None, "not run: this turn already made 1 tool calls"]
    with pytest.raises(OptionError, match="max_calls"):
        run_turn(eng, [], hub, max_calls=-1)


# -- the Responses API's mcp tool -------------------------------------------------------
def test_responses_items_have_openais_shapes(hub):
    req = mcp_request(hub, [{"type": "mcp", "server_label": "time", "allowed_tools": ["get_current_time"]},
                            {"type": "function", "name": "mine"}])
    assert [t.name for t in req.tools] == ["get_current_time"] and req.other_tools == [{"type": "function",
                                                                                         "name": "mine"}]
    (listed,) = req.list_items
    assert listed["type"] == "mcp_list_tools" and listed["server_label"] == "time" and listed["id"].startswith("mcpl_")
    assert [t["name"] for t in listed["tools"]] == ["get_current_time"] and "input_schema" in listed["tools"][0]
    eng = ScriptedEngine([("", [_call("get_current_time", timezone="UTC"), _call("get_current_time", 1,
                                                                              timezone="Nope/Zone")]), ("It is now.", [])])
    turn, items = run_mcp_tools(eng, [{"role": "user", "content": "time?"}], hub, req)
    assert turn.text == "It is now." and [i["type"] for i in items] == ["mcp_list_tools", "mcp_call", "mcp_call"]
    ok, bad = items[1], items[2]
    assert ok["server_label"] == "time" and ok["name"] == "get_current_time" and ok["id"].startswith("mcp_")
    assert json.loads(ok["arguments"]) == {"timezone": "UTC"} and json.loads(ok["output"])["timezone"] == "UTC"
    assert ok["error"] is None and bad["output"] is None and "Nope/Zone" in bad["error"]


def test_a_call_of_a_client_function_ends_the_turn_for_the_client(hub):
    req = mcp_request(hub, [{"type": "mcp", "server_label": "a", "allowed_tools": ["echo"]}])
    mine = {"type": "function", "function": {"name": "lookup", "parameters": {"type": "object", "properties": {}}}}
    eng = ScriptedEngine([("", [_call("a__echo", text="x")]), ("", [_call("lookup", 1)]), ("never reached", [])])
    turn, items = run_mcp_tools(eng, [{"role": "user", "content": "x"}], hub, req, client_tools=[mine])
    assert turn.pending and [c.name for c in turn.result.tool_calls] == ["lookup"] and len(turn.generations) == 2
    assert [i["type"] for i in items] == ["mcp_list_tools", "mcp_call"]
    assert {t["function"]["name"] for t in eng.seen[0][1]["tools"]} == {"a__echo", "lookup"}


def test_a_clashing_tool_is_named_as_its_server_names_it(hub):
    req = mcp_request(hub, [{"type": "mcp", "server_label": "a", "allowed_tools": ["echo"]}])
    assert req.tool_choice({"type": "mcp", "server_label": "a", "name": "echo"}) == {
        "type": "function", "function": {"name": "a__echo"}}
    assert req.tool_choice("auto") == "auto"
    with pytest.raises(OptionError, match="tool_choice names b.echo"):
        req.tool_choice({"type": "mcp", "server_label": "b", "name": "echo"})
    eng = ScriptedEngine([("", [_call("a__echo", text="hi")]), ("hi", [])])
    _, items = run_mcp_tools(eng, [{"role": "user", "content": "x"}], hub, req)
    assert (items[1]["server_label"], items[1]["name"], items[1]["output"]) == ("a", "echo", "echo: hi")


@pytest.mark.parametrize("tool, named", [
    ({"type": "mcp", "server_label": "nope"}, "tools[0].server_label"),
    ({"type": "mcp", "server_label": "time", "server_url": "https://x"}, "tools[0].server_url"),
    ({"type": "mcp", "server_label": "time", "require_approval": "always"}, "tools[0].require_approval"),
    ({"type": "mcp", "server_label": "time", "allowed_tools": ["rm"]}, "tools[0].allowed_tools"),
])
def test_a_bad_mcp_tool_is_refused_naming_the_field(hub, tool, named):
    with pytest.raises(OptionError) as e:
        mcp_request(hub, [tool])
    assert named in str(e.value)


def test_no_hub_refuses_an_mcp_tool():
    with pytest.raises(OptionError, match="serve --mcp"):
        mcp_request(None, [{"type": "mcp", "server_label": "time"}])
    assert not mcp_request(None, [{"type": "function", "name": "f"}])


# -- the real model -----------------------------------------------------------------------
def test_a_real_turn_through_a_responses_mcp_tool(qwen_server):
    """Qwen2.5-Coder-0.5B through ``serve``'s Responses API and the real ``openai`` client: an
    ``mcp`` tool naming a configured server, the call run here, the items OpenAI's shape."""
    with McpHub(parse_mcp_config({"mcpServers": {"time": TIME}})) as h:
        qwen_server.state.mcp = h
        try:
            r = qwen_server.openai().responses.create(
                model=qwen_server.model, input="What time is it in Tokyo?", max_output_tokens=24, store=False,
                tools=[{"type": "mcp", "server_label": "time", "require_approval": "never",
                        "allowed_tools": ["get_current_time"]}],
                tool_choice={"type": "mcp", "server_label": "time", "name": "get_current_time"},
                extra_body={"temperature": 0, "max_tool_calls": 1})
        finally:
            qwen_server.state.mcp = None
    kinds = [o.type for o in r.output]
    assert kinds[:2] == ["mcp_list_tools", "mcp_call"] and kinds[-1] == "message", kinds
    listed, call = r.output[0], r.output[1]
    assert listed.server_label == "time" and [t.name for t in listed.tools] == ["get_current_time"]
    assert call.name == "get_current_time" and call.error is None, call
    assert json.loads(call.output)["timezone"] == json.loads(call.arguments)["timezone"]
    assert kinds == ["mcp_list_tools", "mcp_call", "message"]  # past max_tool_calls it answers without tools
    assert r.usage.output_tokens > 0 and r.status in ("completed", "incomplete")


@pytest.mark.parametrize("extra, named", [({"stream": True}, "stream"), ({"max_tool_calls": -1}, "max_tool_calls"),
                                          ({"tool_choice": {"type": "mcp", "server_label": "time", "name": "rm"}},
                                           "tool_choice")])
def test_a_responses_mcp_request_it_cannot_serve_is_refused_naming_the_field(hub, extra, named):
    from starlette.testclient import TestClient
    from test_server_unit import FakeEngine

    from mlotspark.server import ServerState, create_app

    state = ServerState(FakeEngine())
    state.mcp = hub  # the module's hub: this app's lifespan must not close it
    with TestClient(create_app(state)) as c:
        r = c.post("/v1/responses", json={"model": "default", "input": "time?",
                                          "tools": [{"type": "mcp", "server_label": "time"}], **extra})
        state.mcp = None
    assert r.status_code == 400 and r.json()["error"]["param"] == named, r.json()


# -- serve --mcp --------------------------------------------------------------------------
def test_health_names_the_servers_and_shutdown_ends_them():
    from starlette.testclient import TestClient
    from test_server_unit import FakeEngine

    from mlotspark.server import ServerState, create_app

    before = _children()
    h = McpHub(parse_mcp_config({"mcpServers": {"time": TIME}})).start()
    state = ServerState(FakeEngine(), mcp=h)
    with TestClient(create_app(state)) as c:
        (server,) = c.get("/health").json()["mcp_servers"]
        assert server == {"name": "time", "transport": "stdio", "running": True,
                          "tools": ["get_current_time", "convert_time"]}
    assert not (_children() - before)  # the lifespan's exit closed the hub
    assert h.call("get_current_time", {}).error == "the MCP servers are closed"


@pytest.mark.parametrize("command", ["serve", "chat"])
def test_a_bad_mcp_file_is_refused_before_loading(command, tmp_path, capsys):
    from mlotspark.cli.entry import main

    bad = tmp_path / "mcp.json"
    bad.write_text('{"mcpServers": {"t": {"args": ["x"]}}}')
    assert main([command, "--mcp", str(bad)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "mcpServers.t" in err[0] and "command" in err[0]
