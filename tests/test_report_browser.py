"""The HTML report in a real browser: Debian's chromium, headless, runs the
report's JavaScript (plotly, embedded: no network) and the test reads the
resulting DOM and the browser's console.  Every figure the report declares is
drawn, nothing on the page throws, the findings come first.

The same browser takes the README's pictures: the report's first screen (PNG)
and `profiler advise`'s (SVG, rich's terminal export), each checked.  They go to
tmp_path, or to docs/img/ with HVPROF_SCREENSHOTS=1 (how the committed ones are
made: `HVPROF_SCREENSHOTS=1 .venv/bin/pytest tests/test_report_browser.py -k
screenshots`)."""

from __future__ import annotations

import io
import os
import re
import shutil
import struct
import subprocess
import zlib
from collections import Counter
from pathlib import Path
from xml.etree import ElementTree

import pytest
from conftest import profiler_cli

DATA = Path(__file__).parent / "data" / "analysis"
IMG = Path(__file__).resolve().parents[1] / "docs" / "img"
SCREEN = (1280, 800)

if os.environ.get("HVPROF_NO_CHROMIUM") == "1":
    pytest.skip("HVPROF_NO_CHROMIUM=1: no browser test", allow_module_level=True)


def chromium() -> str:
    path = shutil.which("chromium") or shutil.which("chromium-browser")
    assert path, "chromium not installed (scripts/setup.sh installs it; HVPROF_NO_CHROMIUM=1 skips)"
    return path


def render(page: Path, tmp: Path, fragment: str = "") -> tuple[str, list[str]]:
    """(DOM after the page's scripts ran, the console's messages)."""
    p = subprocess.run(
        [chromium(), "--headless=new", "--no-sandbox", "--disable-gpu", "--no-first-run",
         f"--user-data-dir={tmp / 'chrome-profile'}", "--virtual-time-budget=15000",
         "--enable-logging=stderr", "--v=0", "--dump-dom", page.resolve().as_uri() + fragment],
        capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr[-2000:]
    console = [ln for ln in p.stderr.splitlines() if ":CONSOLE" in ln]
    return p.stdout, console


def screenshot(page: Path, png: Path, tmp: Path) -> None:
    """A PNG of the first screen (SCREEN, at scale 1) of `page` after its scripts ran."""
    p = subprocess.run(
        [chromium(), "--headless=new", "--no-sandbox", "--disable-gpu", "--no-first-run",
         f"--user-data-dir={tmp / 'chrome-profile'}", "--virtual-time-budget=15000",
         "--hide-scrollbars", "--force-device-scale-factor=1",
         f"--window-size={SCREEN[0]},{SCREEN[1]}", f"--screenshot={png}",
         page.resolve().as_uri()],
        capture_output=True, text=True, timeout=120, cwd=tmp)
    assert p.returncode == 0 and png.is_file(), p.stderr[-2000:]


def png_pixels(path: Path) -> tuple[int, int, list[bytes]]:
    """(width, height, each pixel's RGB, row by row): a PNG decoder for what chromium
    writes (8-bit RGB or RGBA, not interlaced), from zlib and struct alone."""
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n", f"{path}: not a PNG"
    pos, idat, head = 8, [], None
    while pos < len(data):
        n, kind = struct.unpack(">I4s", data[pos:pos + 8])
        body = data[pos + 8:pos + 8 + n]
        pos += 12 + n
        if kind == b"IHDR":
            head = struct.unpack(">IIBBBBB", body)
        elif kind == b"IDAT":
            idat.append(body)
        elif kind == b"IEND":
            break
    assert head, f"{path}: no IHDR"
    w, h, depth, ctype, _, _, interlace = head
    assert depth == 8 and ctype in (2, 6) and interlace == 0, head
    bpp = 3 if ctype == 2 else 4
    stride = w * bpp
    raw = zlib.decompress(b"".join(idat))
    assert len(raw) == h * (stride + 1), (len(raw), w, h)
    prev, pixels = bytearray(stride), []
    for y in range(h):
        kind_ = raw[y * (stride + 1)]
        line = bytearray(raw[y * (stride + 1) + 1:(y + 1) * (stride + 1)])
        for i in range(stride) if kind_ else ():
            a = line[i - bpp] if i >= bpp else 0
            b = prev[i]
            if kind_ == 1:
                line[i] = (line[i] + a) & 255
            elif kind_ == 2:
                line[i] = (line[i] + b) & 255
            elif kind_ == 3:
                line[i] = (line[i] + ((a + b) >> 1)) & 255
            else:  # 4: Paeth
                c = prev[i - bpp] if i >= bpp else 0
                pa, pb, pc = abs(b - c), abs(a - c), abs(a + b - 2 * c)
                line[i] = (line[i] + (a if pa <= pb and pa <= pc else b if pb <= pc else c)) & 255
        pixels += [bytes(line[i:i + 3]) for i in range(0, stride, bpp)]
        prev = line
    return w, h, pixels


def test_the_browser_sees_errors(tmp_path: Path) -> None:
    """The method can fail: a page that throws is seen as throwing."""
    bad = tmp_path / "bad.html"
    bad.write_text("<html><body><div id='x'></div><script>undefinedFn();</script>"
                   "</body></html>")
    dom, console = render(bad, tmp_path)
    assert "<div id=\"x\">" in dom
    assert any("Uncaught ReferenceError" in c for c in console), console


@pytest.mark.parametrize("traces", [["fused/trace.json"], ["fused/trace.json",
                                                          "unfused/trace.json"]],
                         ids=["one", "compare"])
def test_report_renders_every_figure(tmp_path: Path, traces: list[str]) -> None:
    out = tmp_path / "report.html"
    p = profiler_cli("report", *[str(DATA / t) for t in traces], "-o", str(out), timeout=300)
    assert p.returncode == 0, p.stderr
    html = out.read_text()
    declared = len(re.findall(r'class="plotly-graph-div"', html))
    assert declared >= 4, declared
    dom, console = render(out, tmp_path)
    drawn = len(re.findall(r'class="[^"]*js-plotly-plot', dom))
    assert drawn == declared, (drawn, declared)
    assert len(re.findall(r'class="main-svg"', dom)) >= declared
    errors = [c for c in console if "Uncaught" in c or "Error" in c]
    assert errors == [], errors
    # the findings section is the first section of the page
    sections = re.findall(r'<h2 id="([^"]+)"', dom)
    assert sections and sections[0] == "findings", sections[:3]


def test_long_tables_fold_and_filter(tmp_path: Path) -> None:
    out = tmp_path / "report.html"
    p = profiler_cli("report", str(DATA / "fused/trace.json"), "-o", str(out), timeout=300)
    assert p.returncode == 0, p.stderr
    html = out.read_text()
    assert '<details class="long">' in html and 'class="filter"' in html
    # "#filter=TEXT" fills the filter boxes: rows without TEXT are hidden
    dom, console = render(out, tmp_path, "#filter=bcast")
    assert [c for c in console if "Uncaught" in c] == []
    folded = re.findall(r'<details class="long" open="">(.*?)</details>', dom, re.S)
    assert folded, "no folded table opened by the filter"
    for part in folded:
        tbody = part[part.index("<tbody>"):]
        body = re.findall(r"<tr( style=\"display: none;\")?>(.*?)</tr>", tbody, re.S)
        shown = [r for hidden, r in body if not hidden]
        hidden = [r for h, r in body if h]
        assert all("bcast" in r for r in shown), shown[:2]
        assert hidden and all("bcast" not in r for r in hidden)
        m = re.search(r'class="count muted">(\d+) of (\d+) rows<', part)
        assert m and int(m.group(1)) == len(shown) and int(m.group(2)) == len(body)


def svg_lines(svg: str) -> list[str]:
    """The terminal lines of rich's SVG export: its text elements, by line."""
    ns = {"s": "http://www.w3.org/2000/svg"}
    lines: dict[float, list[tuple[float, str]]] = {}
    for t in ElementTree.fromstring(svg).iterfind(".//s:g/s:text", ns):
        lines.setdefault(float(t.get("y", 0)), []).append((float(t.get("x", 0)), t.text or ""))
    return ["".join(s for _, s in sorted(parts)).replace("\xa0", " ").rstrip()
            for _, parts in sorted(lines.items())]


def test_screenshots_of_the_report_and_advise(tmp_path: Path) -> None:
    """The README's pictures: the report's first screen as the browser draws it,
    and the first screen of `profiler advise` (100 columns) as an SVG terminal."""
    dest = IMG if os.environ.get("HVPROF_SCREENSHOTS") == "1" else tmp_path
    dest.mkdir(parents=True, exist_ok=True)
    report = tmp_path / "report.html"
    p = profiler_cli("report", str(DATA / "fused/trace.json"), "-o", str(report), timeout=300)
    assert p.returncode == 0, p.stderr
    png = dest / "report.png"
    screenshot(report, png, tmp_path)
    w, h, pixels = png_pixels(png)
    assert (w, h) == SCREEN
    colours = Counter(pixels)
    # a drawn page, not a blank or an error page: text, links, tables
    assert len(colours) >= 64, len(colours)
    assert colours.most_common(1)[0][1] < 0.95 * len(pixels), colours.most_common(3)

    # advise, run where the trace's path is short, as a user would type it
    p = profiler_cli("advise", "fused/trace.json", cwd=DATA, env={"COLUMNS": "100"})
    assert p.returncode == 0, p.stderr
    shown = p.stdout.rstrip("\n").splitlines()[:30]
    assert re.match(r"fused/trace\.json: 2 rank\(s\) on 1 host\(s\), \d+ steps, [\d.]+ ms/step",
                    shown[0]), shown[0]
    from rich.console import Console
    from rich.text import Text

    term = Console(record=True, width=100, file=io.StringIO(), highlight=False,
                   color_system="truecolor")
    term.print(Text("\n".join(shown)), crop=False, soft_wrap=True)
    svg = term.export_svg(title="profiler advise fused/trace.json")
    (dest / "advise.svg").write_text(svg, encoding="utf-8")
    # the picture says what advise printed, line for line, headline first
    assert svg_lines(svg) == [ln.rstrip() for ln in shown]
    # and a browser draws it: the dark terminal with light text on it
    drawn = tmp_path / "advise.png"
    screenshot(dest / "advise.svg", drawn, tmp_path)
    _, _, pixels = png_pixels(drawn)
    colours = Counter(pixels)
    assert colours[bytes((0x29, 0x29, 0x29))] > 0.2 * len(pixels), colours.most_common(3)
    assert colours[bytes((0xc5, 0xc8, 0xc6))] > 1000 and len(colours) >= 16
