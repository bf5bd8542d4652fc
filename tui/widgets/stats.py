"""The side panel: speed, the memory tiers, retrieved memories, the machine, the settings.

The figures come from ``backend`` (turn stats, ``engine.persistence.stats()``, ``engine.status()``);
what the engine cannot report shows as "—". Rendering is pure functions of the
figures so tests can check the text without an app.
"""

from __future__ import annotations

from typing import Any, Iterable

from rich.text import Text
from textual.app import ComposeResult
from textual.containers import VerticalScroll
from textual.widgets import Static

from tui.backend import MachineFigures, TurnFigures

DASH = "—"
LABEL_WIDTH = 9
SPARK_POINTS = 24  # tok/s samples kept for the sparkline (one a second; fits the panel)
SETTING_LABELS = (  # option, short label
    ("temperature", "temp"), ("top_p", "top_p"), ("top_k", "top_k"),
    ("min_p", "min_p"), ("max_tokens", "max"), ("repetition_penalty", "rep"),
)
THERMAL_STYLES = {"nominal": "green", "fair": "yellow", "serious": "dark_orange", "critical": "bold red"}
PRESSURE_LEVELS = ("normal", "warn", "critical")  # macOS kernel memory pressure 0, 1, 2
PRESSURE_STYLES = {"normal": "green", "warn": "yellow", "critical": "bold red"}


def mb(n: Any) -> str:
    return DASH if n is None else f"{n / 1e6:.1f} MB"


def pct(rate: Any) -> str:
    return DASH if rate is None else f"{100 * rate:.0f}%"


def num(v: Any, fmt: str = "{}") -> str:
    return DASH if v is None else fmt.format(v)


BARS = "▁▂▃▄▅▆▇█"


def sparkline(samples: list[float], width: int) -> str:
    """The last ``width`` samples as bars scaled from 0 to their maximum (Textual's
    Sparkline scales min..max, which makes a 12 -> 11 tok/s dip look like a stall)."""
    tail = samples[-width:]
    top = max(tail, default=0.0)
    if top <= 0:
        return BARS[0] * len(tail)
    return "".join(BARS[min(len(BARS) - 1, int(v / top * (len(BARS) - 1) + 0.5))] for v in tail)


def _rows(title: str, rows: Iterable[tuple[str, str | Text]]) -> Text:
    out = Text(title + "\n", style="bold")
    for label, value in rows:
        out.append(f" {label:<{LABEL_WIDTH}}", style="dim")
        out.append(value if isinstance(value, Text) else Text(value))
        out.append("\n")
    return out


def speed_text(turn: TurnFigures, live_tps: float | None, live_ttft: float | None, streaming: bool,
               samples: list[float] | None = None) -> Text:
    """tok/s (live while streaming) with its sparkline, TTFT and token counts of the last turn."""
    tps = live_tps if streaming else turn.decode_tps
    ttft = live_ttft if streaming else turn.ttft_s
    tokens = DASH if turn.prompt_tokens is None else f"{turn.prompt_tokens} in · {num(turn.generated)} out"
    return _rows("Speed", [
        ("tok/s", num(tps, "{:.1f}") + ("  (live)" if streaming and tps is not None else "")),
        ("", Text(sparkline(samples, SPARK_POINTS), style="green") if samples else Text("")),
        ("TTFT", "…" if streaming and ttft is None else num(ttft, "{:.2f} s")),
        ("tokens", tokens),
    ])


def tiers_text(turn: TurnFigures, tiers: dict | None) -> Text:
    """Tokens, bytes and hit rates per memory tier."""
    t = tiers or {}
    working, episodic = t.get("working") or {}, t.get("episodic") or {}
    prefix, semantic = t.get("prefix_cache") or {}, t.get("semantic") or {}
    cascade = turn.cascade or working.get("cascade") or {}
    ctok = cascade.get("tokens") or {}
    if ctok:
        work = f"{ctok.get('sinks', 0) + ctok.get('window', 0)} tok · {mb(working.get('bytes'))}"
        epi = f"{ctok.get('episodic', 0)} tok · hit {pct((cascade.get('store') or {}).get('hit_rate'))}"
    else:
        in_context = None if turn.prompt_tokens is None else turn.prompt_tokens + (turn.generated or 0)
        work = f"{num(in_context)} tok · {mb(working.get('bytes'))}" if working or in_context else DASH
        epi = (f"{episodic.get('snapshots', 0)} snap · {mb(episodic.get('bytes'))} · hit {pct(episodic.get('hit_rate'))}"
               if episodic else DASH)
    reused = DASH
    if turn.cached_tokens is not None:
        reused = f"{turn.cached_tokens} tok" + (f" ({turn.cache_source})" if turn.cache_source else "")
    return _rows("Memory tiers", [
        ("working", work),
        ("episodic", epi),
        ("prefix", f"{prefix.get('entries', 0)} · hit {pct(prefix.get('hit_rate'))}" if prefix else DASH),
        ("semantic", f"{semantic.get('entries', 0)} · hit {pct(semantic.get('hit_rate'))}" if semantic else DASH),
        ("reused", reused),
    ])


def memories_text(turn: TurnFigures) -> Text:
    """The semantic memories put into this turn's prompt."""
    out = Text("Retrieved this turn\n", style="bold")
    if not turn.memories:
        out.append(f" {DASH}\n", style="dim")
    for m in turn.memories[:5]:
        out.append(f" {m}\n")
    if turn.learned:  # and what it replaced: an update the rules saw (/forget the newer one undoes it)
        updated = f" · updated {turn.updated}: /memory" if turn.updated else ""
        out.append(f" + learned {turn.learned}{updated}\n", style="dim")
    if turn.forgotten:  # a retraction in the message ("Forget that ...")
        out.append(f" - forgot {turn.forgotten}\n", style="dim")
    if turn.not_forgotten:  # one that named nothing clearly: nothing was deleted on a guess
        out.append(f" ? {turn.not_forgotten} not forgotten: /memory, /forget ID\n", style="yellow")
    if turn.not_remembered:  # "Remember that ..." kept nothing: too short, a reminder, or too long
        out.append(f" ? {turn.not_remembered} not remembered: /remember TEXT (3-2,000 characters of a fact)\n",
                   style="yellow")
    return out


def gb(n: Any) -> str:
    return DASH if n is None else f"{n / 1e9:.1f} GB"


def pressure_text(m: MachineFigures) -> Text:
    """What the memory signal reads now: the kernel's level on macOS, else RAM in use."""
    if m.pressure_level is not None:
        name = PRESSURE_LEVELS[min(max(int(m.pressure_level), 0), 2)]
        return Text(name, style=PRESSURE_STYLES[name])
    if m.pressure is None:  # the governor reads the machine once requests run
        return Text(DASH if m.memory_signal is None else f"{DASH} until the first reply", style="dim")
    out = Text(f"{m.pressure:.0%} used")
    if m.available_bytes is not None:
        out.append(f" · {gb(m.available_bytes)} free")
    return out


def kv_text(m: MachineFigures) -> str:
    """KV held by requests in flight, of the budget in force."""
    used = mb(m.kv_bytes or 0) if m.kv_bytes is not None or m.kv_budget is not None else DASH
    return used if m.kv_budget is None else f"{used} of {gb(m.kv_budget)} budget"


def machine_text(m: MachineFigures | None, rss: int | None, peak_mb: float | None) -> Text:
    """Thermal state, batch cap and size, queue, memory in use, the memory signal in force
    with its reading, and KV against its budget."""
    m = m or MachineFigures()
    state = Text(num(m.state), style=THERMAL_STYLES.get(m.state or "", ""))
    if m.mode:
        state.append(f" · {m.mode}", style="dim")
    memory = mb(rss) if rss is not None else (num(peak_mb, "{:.0f} MB peak"))
    rows = [
        ("thermal", state),
        ("batch", f"{num(m.batch_size)} · cap {num(m.cap)} · queue {num(m.queued)}"),
        ("memory", memory),
        ("signal", num(m.memory_signal)),
        ("pressure", pressure_text(m)),
        ("KV", kv_text(m)),
    ]
    for r in m.ranks:  # one row per rank of a distributed engine: the hottest paces every token
        rows.append((f"rank {r.get('rank', '?')}", rank_text(r)))
    if m.blas_warning:
        rows.append(("BLAS", Text(f"⚠ {m.blas_warning}", style="bold red")))
    return _rows("Machine", rows)


def rank_text(r: dict) -> Text:
    """One rank: host, layers, memory in use and free, thermal state, last step time."""
    layers = r.get("layers") or []
    where = f"{r.get('host', DASH)} L{layers[0]}-{layers[1] - 1}" if len(layers) == 2 else str(r.get("host", DASH))
    free_mb = r.get("available_mb")
    free = num(None if free_mb is None else free_mb / 1e3, "{:.1f} GB free")
    out = Text(f"{where} · {num(r.get('rss_mb'), '{:.0f} MB')} · {free} · ")
    out.append(str(r.get("thermal") or DASH), style=THERMAL_STYLES.get(r.get("thermal") or "", ""))
    out.append(f" · step {num(r.get('last_step_ms'), '{:.0f} ms')}")
    return out


def settings_text(settings: dict, sources: dict | None = None) -> Text:
    """The sampling settings of this session (changed by slash commands), and where the
    ones not at the global default came from (``Engine.sampling_sources``)."""
    out = Text("Settings\n", style="bold")
    parts = [f"{label} {settings.get(name, DASH)}" for name, label in SETTING_LABELS]
    out.append(" " + "  ".join(parts[:3]) + "\n " + "  ".join(parts[3:]) + "\n")
    by_source: dict[str, list[str]] = {}
    for name, label in SETTING_LABELS:
        src = (sources or {}).get(name)
        if src and src != "mlotspark default":
            by_source.setdefault(src, []).append(label)
    for src, labels in by_source.items():
        out.append(f" {', '.join(labels)}: {src}\n", style="dim")
    return out


class StatsPanel(VerticalScroll):
    """Live figures of the engine at work. The app sets the fields and calls ``refresh_figures``."""

    def __init__(self, *, id: str | None = None) -> None:
        super().__init__(id=id)
        self.turn = TurnFigures()
        self.machine: MachineFigures | None = None
        self.tiers: dict | None = None
        self.settings: dict = {}
        self.sources: dict = {}  # option -> where its default came from
        self.rss: int | None = None
        self.streaming = False
        self.live_tps: float | None = None
        self.live_ttft: float | None = None
        self.samples: list[float] = []

    def compose(self) -> ComposeResult:
        yield Static(id="speed")
        yield Static(id="tiers")
        yield Static(id="memories")
        yield Static(id="machine")
        yield Static(id="settings")

    def on_mount(self) -> None:
        self.refresh_figures()

    def add_sample(self, tps: float) -> None:
        """One tok/s point on the sparkline."""
        self.samples = [*self.samples, float(tps)][-SPARK_POINTS:]

    def refresh_figures(self) -> None:
        if not self.is_mounted or not self.children:  # a timer may fire while the app shuts down
            return
        self.query_one("#speed", Static).update(
            speed_text(self.turn, self.live_tps, self.live_ttft, self.streaming, self.samples))
        self.query_one("#tiers", Static).update(tiers_text(self.turn, self.tiers))
        self.query_one("#memories", Static).update(memories_text(self.turn))
        self.query_one("#machine", Static).update(machine_text(self.machine, self.rss, self.turn.peak_memory_mb))
        self.query_one("#settings", Static).update(settings_text(self.settings, self.sources))

    def text(self) -> str:
        """Everything the panel shows, as plain text (for tests)."""
        parts = (
            speed_text(self.turn, self.live_tps, self.live_ttft, self.streaming, self.samples),
            tiers_text(self.turn, self.tiers), memories_text(self.turn),
            machine_text(self.machine, self.rss, self.turn.peak_memory_mb), settings_text(self.settings, self.sources),
        )
        return "".join(p.plain for p in parts)


__all__ = ["StatsPanel", "kv_text", "machine_text", "pressure_text", "rank_text", "sparkline", "memories_text", "settings_text", "speed_text", "tiers_text"]
