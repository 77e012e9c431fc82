"""The HTML report in a real browser: Debian's chromium, headless, runs the
report's JavaScript (plotly, embedded: no network) and the test reads the
resulting DOM and the browser's console.  Every figure the report declares is
drawn, nothing on the page throws, the findings come first.

The same browser draws the README's picture, the report's breakdown chart,
into docs/img/breakdown.png on every run (tests/readme_picture.py says how,
and how test_docs checks it is current), and takes the guide's pictures: the
report's first screen (PNG) and `profiler advise`'s (SVG, rich's terminal
export), each checked.  Those two go to tmp_path, or to docs/img/ with
HVPROF_SCREENSHOTS=1 (how the committed ones are made:
`HVPROF_SCREENSHOTS=1 .venv/bin/pytest tests/test_report_browser.py -k
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


def screenshot(page: Path, png: Path, tmp: Path, size: tuple[int, int] = SCREEN) -> None:
    """A PNG of the first screen (`size`, at scale 1) of `page` after its scripts ran."""
    p = subprocess.run(
        [chromium(), "--headless=new", "--no-sandbox", "--disable-gpu", "--no-first-run",
         f"--user-data-dir={tmp / 'chrome-profile'}", "--virtual-time-budget=15000",
         "--hide-scrollbars", "--force-device-scale-factor=1",
         f"--window-size={size[0]},{size[1]}", f"--screenshot={png}",
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
    # the page opens with the breakdown chart and the findings' headlines, the
    # details after them
    sections = re.findall(r'<h2 id="([^"]+)"', dom)
    assert sections[:3] == ["overview", "findings", "breakdown"], sections[:3]
    first = dom.split('<h2 id="overview"', 1)[1].split("<h2 ", 1)[0]
    assert first.count('<ol class="headlines">') == len(traces)
    # these traces have no step breakdown (no synchronize rows): the overview
    # says so where the chart would be (the README's trace, below, has one)
    assert first.count("no step breakdown") == len(traces)
    assert first.index("no step breakdown") < first.index('<ol class="headlines">')


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


def _rgb(hex_colour: str) -> bytes:
    return bytes.fromhex(hex_colour.lstrip("#"))


# Where the first screen's parts lie once the page has drawn: appended to a copy
# of the report, it writes the top and bottom of the chart and of the headlines
# into the DOM that --dump-dom returns.
LAYOUT_PROBE = """<script>window.addEventListener('load', function () {
 var c = document.querySelector('#overview ~ section.figure .js-plotly-plot')
   || document.querySelector('.js-plotly-plot');
 var h = document.querySelector('ol.headlines');
 var m = document.createElement('meta'); m.id = 'layout';
 m.setAttribute('content', [c.getBoundingClientRect().top, c.getBoundingClientRect().bottom,
   h.getBoundingClientRect().top, h.getBoundingClientRect().bottom].join(','));
 document.head.appendChild(m); });</script>"""


def test_the_readme_picture_is_the_reports_chart(tmp_path: Path) -> None:
    """docs/img/breakdown.png, redrawn: the report's chart alone, as the browser
    draws it, with the digest of the figure beside it (readme_picture)."""
    import json

    import readme_picture as rp

    from profiler.analysis.figures import PART_COLORS

    fig = rp.figure()
    page = tmp_path / "chart.html"
    page.write_text(rp.page(fig), encoding="utf-8")
    drawn = tmp_path / "breakdown.png"
    screenshot(page, drawn, tmp_path, size=rp.SIZE)
    w, h, pixels = png_pixels(drawn)
    assert (w, h) == rp.SIZE
    colours = Counter(pixels)
    # the bars: compute fills most of each, and at least one more part shows
    assert colours[_rgb(PART_COLORS["compute"])] > 0.1 * len(pixels), colours.most_common(5)
    others = [p for p in PART_COLORS if p != "compute" and colours[_rgb(PART_COLORS[p])] > 20]
    assert others, colours.most_common(8)
    rp.PICTURE.parent.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(drawn, rp.PICTURE)
    rp.SIDECAR.write_text(json.dumps({"digest": rp.digest(fig), "size": list(rp.SIZE),
                                      "trace": rp.TRACE.relative_to(rp.ROOT).as_posix()},
                                     indent=1) + "\n", encoding="utf-8")


def test_screenshots_of_the_report_and_advise(tmp_path: Path) -> None:
    """The guide's pictures: the report's first screen as the browser draws it
    (the README's run), and the first screen of `profiler advise` (100 columns)
    as an SVG terminal.  At 1280x800 the report's first screen holds the
    breakdown chart, then the findings' headlines."""
    import readme_picture

    from profiler.analysis.figures import PART_COLORS

    dest = IMG if os.environ.get("HVPROF_SCREENSHOTS") == "1" else tmp_path
    dest.mkdir(parents=True, exist_ok=True)
    report = tmp_path / "report.html"
    p = profiler_cli("report", str(readme_picture.TRACE), "-o", str(report), timeout=300)
    assert p.returncode == 0, p.stderr
    probe = tmp_path / "probe.html"
    probe.write_text(report.read_text().replace("</body>", LAYOUT_PROBE + "</body>"))
    p = subprocess.run(
        [chromium(), "--headless=new", "--no-sandbox", "--disable-gpu", "--no-first-run",
         f"--user-data-dir={tmp_path / 'chrome-profile'}", "--virtual-time-budget=15000",
         "--hide-scrollbars", "--force-device-scale-factor=1",
         f"--window-size={SCREEN[0]},{SCREEN[1]}", "--dump-dom", probe.resolve().as_uri()],
        capture_output=True, text=True, timeout=120)
    m = re.search(r'<meta id="layout" content="([-\d.,]+)"', p.stdout)
    assert m, p.stderr[-2000:]
    chart_top, chart_bottom, head_top, head_bottom = map(float, m.group(1).split(","))
    assert 0 <= chart_top < chart_bottom <= head_top < head_bottom <= SCREEN[1], m.group(1)
    first = p.stdout.split('<h2 id="overview"', 1)[1].split("<h2 ", 1)[0]
    assert re.search(r'id="fig-breakdown-ranks-[^"]+" class="[^"]*js-plotly-plot', first)
    png = dest / "report.png"
    screenshot(report, png, tmp_path)
    w, h, pixels = png_pixels(png)
    assert (w, h) == SCREEN
    colours = Counter(pixels)
    # a drawn page, not a blank or an error page: text, links, and the chart's bars
    assert len(colours) >= 64, len(colours)
    assert colours.most_common(1)[0][1] < 0.95 * len(pixels), colours.most_common(3)
    assert colours[_rgb(PART_COLORS["compute"])] > 5000, colours.most_common(5)

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
