"""The HTML pages as a person sees them: the leaderboard and the run report rendered by headless Chromium.

Chromium's DOM dump shows the tables and charts as the browser built them (rows per table, bars
drawn in the SVGs), and a screenshot shows that the page is painted: many colours, the verdict
colours of the matrix among them. Skipped, saying why, where Chromium is not installed
(Debian: ``apt-get install chromium``; .ci/run installs it).
"""
import os
import shutil
import struct
import subprocess
import zlib
from html.parser import HTMLParser

import numpy as np
import pytest

from board_reports import board_reports  # noqa: F401  (the session fixture)
from fk_pytest import leaderboard

CHROMIUM = next((p for p in ("/usr/bin/chromium", shutil.which("chromium") or "", shutil.which("chromium-browser") or "")
                 if p and os.access(p, os.X_OK)), None)
pytestmark = pytest.mark.skipif(CHROMIUM is None, reason="no Chromium here (Debian: apt-get install chromium)")
FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars", "--no-first-run",
         "--disable-extensions", "--mute-audio"]


def chromium(*args, cwd) -> str:
    # its own profile folder: no state shared with another run, nothing written in $HOME
    done = subprocess.run([CHROMIUM, *FLAGS, f"--user-data-dir={cwd / 'profile'}", *args], cwd=cwd,
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr[-2000:]
    return done.stdout


class Page(HTMLParser):
    """Per table its rows (cells' text), per SVG the bars and lines it draws."""

    def __init__(self, dom: str):
        super().__init__()
        self.tables, self.svgs, self.cell = [], [], None
        self.feed(dom)

    def handle_starttag(self, tag, attrs):
        attrs = dict(attrs)
        if tag == "table":
            self.tables.append([])
        elif tag == "tr":
            self.tables[-1].append([])
        elif tag in ("td", "th"):
            self.cell = []
        elif tag == "svg":
            self.svgs.append({"bars": 0, "lines": 0})
        elif tag == "rect" and float(attrs.get("width", 0)) > 0:
            self.svgs[-1]["bars"] += 1
        elif tag in ("line", "path"):
            self.svgs[-1]["lines"] += 1

    def handle_endtag(self, tag):
        if tag in ("td", "th") and self.cell is not None:
            self.tables[-1][-1].append("".join(self.cell).strip())
            self.cell = None

    def handle_data(self, data):
        if self.cell is not None:
            self.cell.append(data)


def png_pixels(path):
    """(width, height, set of RGB colours) of an 8-bit RGB/RGBA PNG, as Chromium writes them.

    Rows filtered None/Sub/Up (most of a page) are undone with numpy; Average and Paeth rows,
    which depend on the pixel to their left, byte by byte."""
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    pos, idat, header = 8, [], None
    while pos < len(data):
        length, kind = struct.unpack(">I4s", data[pos:pos + 8])
        body = data[pos + 8:pos + 8 + length]
        if kind == b"IHDR":
            header = struct.unpack(">IIBBBBB", body)
        elif kind == b"IDAT":
            idat.append(body)
        pos += 12 + length
    width, height, depth, colour, *_ = header
    assert depth == 8 and colour in (2, 6), header
    bpp, stride = (3 if colour == 2 else 4), width * (3 if colour == 2 else 4)
    raw = np.frombuffer(zlib.decompress(b"".join(idat)), np.uint8).reshape(height, stride + 1)
    out = np.zeros((height, stride), np.uint8)
    prev = np.zeros(stride, np.uint8)
    for y in range(height):
        kind, line = raw[y, 0], raw[y, 1:]
        if kind == 0:
            row = line.copy()
        elif kind == 1:
            row = (np.cumsum(line.reshape(width, bpp), axis=0, dtype=np.uint64) % 256).astype(np.uint8).ravel()
        elif kind == 2:
            row = line + prev
        else:
            row = np.frombuffer(bytes(_unfilter_left(kind, line.tolist(), prev.tolist(), bpp)), np.uint8)
        out[y] = prev = row
    rgb = out.reshape(height, width, bpp)[:, :, :3].reshape(-1, 3)
    return width, height, rgb


def _unfilter_left(kind, row, up, bpp):
    """Average (3) or Paeth (4): each byte predicted from its left neighbour as already decoded."""
    for i in range(len(row)):
        a = row[i - bpp] if i >= bpp else 0
        b = up[i]
        if kind == 3:
            row[i] = (row[i] + ((a + b) >> 1)) & 255
            continue
        c = up[i - bpp] if i >= bpp else 0
        pa, pb, pc = b - c, a - c, a + b - c - c
        pa, pb, pc = (pa if pa >= 0 else -pa), (pb if pb >= 0 else -pb), (pc if pc >= 0 else -pc)
        row[i] = (row[i] + (a if pa <= pb and pa <= pc else b if pb <= pc else c)) & 255
    return row


def _hex(colour: str):
    return tuple(int(colour[i:i + 2], 16) for i in (1, 3, 5))


def test_leaderboard_and_run_report_render_in_chromium(board_reports, tmp_path):
    board = tmp_path / "board.html"
    assert leaderboard.main([str(p) for p in board_reports.values()] + ["--html", str(board)]) == 0

    page = Page(chromium("--dump-dom", board.as_uri(), cwd=tmp_path))
    ranking, scopes, matrix, provenance = page.tables
    assert ranking[0][:3] == ["rank", "candidate", "MacroEval"] and len(ranking) == 1 + 3
    assert [row[1] for row in ranking[1:]][-1].startswith("stub_tree@")  # the stub ranks last
    assert len(matrix) == 1 + 2 and matrix[0][0] == "task" and len(matrix[1]) == 1 + 3
    assert {row[0] for row in scopes[1:]} == {"L1", "norm", "activation"} and len(provenance) == 1 + 3
    (chart,) = page.svgs
    assert chart["bars"] == 2 and chart["lines"] >= 1  # reference and example drawn; the stub's 0 has no bar

    run_page = board_reports["example"].with_suffix(".html")
    run = Page(chromium("--dump-dom", run_page.as_uri(), cwd=tmp_path))
    tasks_table = next(t for t in run.tables if t and t[0][:2] == ["task", "level"])
    assert sorted(row[0] for row in tasks_table[1:]) == ["rms_norm", "silu_and_mul"]
    assert all(row[3] == "PASSED" for row in tasks_table[1:])
    assert run.svgs and sum(s["bars"] for s in run.svgs) >= 2

    for html_file, must_show in ((board, ("#dcefdc", "#ececec", "#2a7d2a")), (run_page, ("#2a7d2a",))):
        shot = tmp_path / f"{html_file.stem}.png"
        chromium(f"--screenshot={shot}", "--window-size=1280,1600", html_file.as_uri(), cwd=tmp_path)
        width, height, pixels = png_pixels(shot)
        assert (width, height) == (1280, 1600)
        # each pixel's RGB as one integer: np.unique over rows (axis=0) sorted the 2M rows of
        # the page as records, 2.2 s a screenshot; over integers it takes a few hundredths
        packed = np.unique(pixels.astype(np.uint32) @ np.array([1 << 16, 1 << 8, 1], np.uint32))
        colours = {(int(v) >> 16, (int(v) >> 8) & 255, int(v) & 255) for v in packed}
        assert len(colours) > 50, f"{shot.name}: {len(colours)} colours, a blank page?"
        ink = float((pixels != 255).any(axis=1).mean())
        assert ink > 0.02, f"{shot.name}: only {ink:.1%} of the pixels are not white"
        for colour in must_show:  # passed and not-implemented cells and the bars are painted
            assert _hex(colour) in colours, f"{shot.name}: no pixel of {colour}"
