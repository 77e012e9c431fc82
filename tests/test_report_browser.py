"""The HTML report in a real browser: Debian's chromium, headless, runs the
report's JavaScript (plotly, embedded: no network) and the test reads the
resulting DOM and the browser's console.  Every figure the report declares is
drawn, nothing on the page throws, the findings come first."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest
from conftest import profiler_cli

DATA = Path(__file__).parent / "data" / "analysis"

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
