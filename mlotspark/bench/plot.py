"""``--plot FILE.png``: one horizontal bar pair per figure, drawn with numpy, written as PNG.

No plotting library is needed (matplotlib is not a dependency): the chart is a few
rectangles and labels in a 5x7 bitmap font, encoded with zlib. Each row's bars are
scaled to the larger of the two medians in that row, so rows of different units sit
together; the numbers are printed next to the bars.
"""

from __future__ import annotations

import statistics
import struct
import zlib
from pathlib import Path

import numpy as np

from mlotspark.errors import OptionError
from mlotspark.storage import atomic_write
from mlotspark.bench.figures import Report
from mlotspark.bench.formats import _thermal, num

# Classic 5x7 font, column-major, bit 0 at the top (upper case only).
_FONT = {
    "0": "3E5149453E", "1": "00427F4000", "2": "4261514946", "3": "2141454B31", "4": "1814127F10",
    "5": "2745454539", "6": "3C4A494930", "7": "0171090503", "8": "3649494936", "9": "064949291E",
    "A": "7E1111117E", "B": "7F49494936", "C": "3E41414122", "D": "7F4141221C", "E": "7F49494941",
    "F": "7F09090901", "G": "3E4149497A", "H": "7F0808087F", "I": "00417F4100", "J": "2040413F01",
    "K": "7F08142241", "L": "7F40404040", "M": "7F020C027F", "N": "7F0408107F", "O": "3E4141413E",
    "P": "7F09090906", "Q": "3E4151215E", "R": "7F09192946", "S": "4649494931", "T": "01017F0101",
    "U": "3F4040403F", "V": "1F2040201F", "W": "3F4038403F", "X": "6314081463", "Y": "0708700807",
    "Z": "6151494543", ".": "0060600000", ",": "0050300000", ":": "0036360000", "-": "0808080808",
    "_": "4040404040", "/": "2010080402", "(": "001C224100", ")": "0041221C00", "[": "007F414100",
    "]": "0041417F00", "%": "2313086462", "=": "1414141414", "+": "08083E0808", ">": "4122140800",
    "<": "0814224100", "'": "0005030000", "?": "0201510906", " ": "0000000000",
}
_ALIASES = {"×": "X", "–": "-", "—": "-", "→": ">", "·": "-", "°": "'"}
SCALE = 2  # pixels per font dot
ADVANCE = 6 * SCALE  # glyph width + 1 dot of spacing
LINE = 9 * SCALE
BLUE, ORANGE, GREY, INK, WHITE = (31, 119, 180), (255, 127, 14), (200, 200, 200), (20, 20, 20), (255, 255, 255)


def _text(img: np.ndarray, x: int, y: int, text: str, color: tuple[int, int, int] = INK) -> None:
    """Draw ``text`` with its top-left corner at (x, y); clipped to the image."""
    h, w, _ = img.shape
    for ch in text.upper():
        cols = _FONT.get(_ALIASES.get(ch, ch), _FONT["?"])
        for c in range(5):
            bits = int(cols[2 * c : 2 * c + 2], 16)
            for r in range(7):
                if bits >> r & 1:
                    y0, x0 = y + r * SCALE, x + c * SCALE
                    if 0 <= y0 < h - SCALE and 0 <= x0 < w - SCALE:
                        img[y0 : y0 + SCALE, x0 : x0 + SCALE] = color
        x += ADVANCE


def _rect(img: np.ndarray, x: int, y: int, w: int, h: int, color: tuple[int, int, int]) -> None:
    img[max(y, 0) : y + h, max(x, 0) : x + w] = color


def encode_png(rgb: np.ndarray) -> bytes:
    """PNG bytes of an (H, W, 3) uint8 image (filter 0 on every row)."""
    h, w, _ = rgb.shape
    raw = b"".join(b"\x00" + rgb[y].tobytes() for y in range(h))

    def chunk(tag: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + tag + data + struct.pack(">I", zlib.crc32(tag + data) & 0xFFFFFFFF)

    ihdr = struct.pack(">IIBBBBB", w, h, 8, 2, 0, 0, 0)  # 8-bit RGB
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", ihdr) + chunk(b"IDAT", zlib.compress(raw, 9)) + chunk(b"IEND", b"")


def check_path(path: str | Path) -> Path:
    """The plot path, if it names a ``.png`` file.

    Raises:
        OptionError: another extension.
    """
    p = Path(path)
    if p.suffix.lower() != ".png":
        raise OptionError(f"invalid --plot {str(path)!r}: the plot is written as PNG, name a .png file")
    return p


def plot_report(report: Report, path: str | Path) -> Path:
    """Draw the report's figures as bars and write ``path`` (PNG).

    Returns:
        The path written.
    """
    path = check_path(path)
    label_chars, bar_w, value_chars, margin = 40, 360, 20, 16
    labels = [f"{f.suite} {f.case} {f.metric} {f.unit}"[:label_chars] for f in report.figures]
    row_h = 2 * LINE + 10
    width = margin * 2 + label_chars * ADVANCE + bar_w + value_chars * ADVANCE
    top = margin + 4 * LINE
    height = top + max(1, len(report.figures)) * row_h + len(report.errors) * LINE + margin
    img = np.full((height, width, 3), WHITE, dtype=np.uint8)
    h = report.header
    _text(img, margin, margin, f"mlotspark bench: {h.get('model')} {h.get('weights')} on {h.get('device')}")
    _text(img, margin, margin + LINE, f"thermal {_thermal(h.get('thermal_start'))} > {_thermal(h.get('thermal_end'))}")
    _rect(img, margin, margin + 2 * LINE + 2, 2 * ADVANCE, LINE - 6, BLUE)
    _text(img, margin + 3 * ADVANCE, margin + 2 * LINE, "mlotspark")
    if report.compared:
        _rect(img, margin + 14 * ADVANCE, margin + 2 * LINE + 2, 2 * ADVANCE, LINE - 6, ORANGE)
        _text(img, margin + 17 * ADVANCE, margin + 2 * LINE, "mlx-lm  (ratio > 1: mlotspark better)")
    x_bar = margin + label_chars * ADVANCE
    previous = None
    for i, (f, label) in enumerate(zip(report.figures, labels)):
        y = top + i * row_h
        if previous is not None and f.suite != previous:
            _rect(img, margin, y - 5, width - 2 * margin, 1, GREY)
        previous = f.suite
        _text(img, margin, y + LINE // 2, label)
        ours = statistics.median(f.values) if f.values else 0.0
        ref = statistics.median(f.reference) if f.reference else 0.0
        scale = max(ours, ref, 1e-12)
        for j, (value, color) in enumerate(((ours, BLUE), (ref, ORANGE))):
            if j == 1 and not f.reference:
                continue
            yb = y + j * LINE
            _rect(img, x_bar, yb, max(1, int(bar_w * value / scale)), LINE - 4, color)
            text = num(value) + (f"  {f.ratio:.2f}x" if j == 1 and f.ratio is not None else "")
            _text(img, x_bar + bar_w + ADVANCE, yb, text)
    y = top + len(report.figures) * row_h
    for e in report.errors:
        _text(img, margin, y, f"not run: {e.message}"[: (width - 2 * margin) // ADVANCE])
        y += LINE
    atomic_write(path, encode_png(img))
    return path


__all__ = ["check_path", "encode_png", "plot_report"]
