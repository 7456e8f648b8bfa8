"""The live page in a real headless Chromium (Debian's, driven by its chromedriver through selenium) during a
real ``flopwatch demo`` run (real Kafka, the embedded chDB held by the demo's process): the demo prints the
page's URL; both charts draw; the efficiency drop the demo's scenario plants appears as a firing alert; and,
once the demo has stopped and its database can be opened, what the charts drew and the heatmap showed are
what SQL over ``gpu_frames`` gives. The screenshot is kept in ``build/artifacts/live-page.png`` (or
``$FLOPWATCH_ARTIFACTS_DIR``)."""

from __future__ import annotations

import os
import re
import subprocess
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from selenium import webdriver
from selenium.webdriver.chrome.service import Service

from agents.livepage.heatmap import heatmap_sql
from agents.settings import Settings
from agents.sinks.clickhouse import ChdbBackend
from schemas.resolution import stored_as
from tests.agents.test_web import free_port
from tests.integration.conftest import ROOT

CHROMIUM, CHROMEDRIVER = "/usr/bin/chromium", "/usr/bin/chromedriver"
DURATION_S = 75  # the scenario's efficiency drop runs from 40 s to 55 s
ARTIFACTS = Path(os.environ.get("FLOPWATCH_ARTIFACTS_DIR", ROOT / "build" / "artifacts"))


def wait_for(what: str, check: Any, timeout_s: float, every_s: float = 0.5) -> Any:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        got = check()
        if got:
            return got
        time.sleep(every_s)
    raise AssertionError(f"timed out after {timeout_s:.0f} s waiting for {what}")


@pytest.fixture
def browser() -> Iterator[webdriver.Chrome]:
    opts = webdriver.ChromeOptions()
    opts.binary_location = CHROMIUM
    for arg in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--disable-gpu",
                "--window-size=1400,1500"):
        opts.add_argument(arg)
    # An explicit driver: selenium's own manager would try to download one.
    driver = webdriver.Chrome(options=opts, service=Service(CHROMEDRIVER))
    driver.set_script_timeout(10)
    try:
        yield driver
    finally:
        driver.quit()


def demo_env(s: Settings, port: int) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("FLOPWATCH_CLICKHOUSE")}
    env.update(FLOPWATCH_KAFKA_BOOTSTRAP=s.kafka_bootstrap, FLOPWATCH_TOPIC_PREFIX=s.topic_prefix,
               FLOPWATCH_GROUP_ID=s.group_id, FLOPWATCH_PARTITIONS=str(s.partitions),
               FLOPWATCH_CHDB_PATH=s.chdb_path, FLOPWATCH_CLICKHOUSE_BACKEND="chdb",
               FLOPWATCH_CLICKHOUSE_DATABASE=s.clickhouse_database, FLOPWATCH_WEB_ENABLED="true",
               FLOPWATCH_WEB_PORT=str(port))
    return env


def drawn_pixels(driver: webdriver.Chrome, chart: str) -> int:
    """Pixels of the chart's canvas that are not blank: the lines were drawn."""
    return int(driver.execute_script(
        "const u = window.flopwatch.charts[arguments[0]]; const c = u.ctx.canvas;"
        "const d = u.ctx.getImageData(0, 0, c.width, c.height).data; let n = 0;"
        "for (let i = 3; i < d.length; i += 4) if (d[i] > 0) n++; return n;", chart))


def test_live_page_in_chromium_matches_sql(base_settings: Settings, browser: webdriver.Chrome,
                                           tmp_path: Path) -> None:
    port = free_port()
    log_path = tmp_path / "demo.log"
    with log_path.open("wb") as log:
        demo = subprocess.Popen([str(ROOT / ".venv/bin/flopwatch"), "demo", "--duration", str(DURATION_S)],
                                cwd=ROOT, env=demo_env(base_settings, port), stdout=log, stderr=subprocess.STDOUT)
    try:
        url = wait_for("the demo to print the page's URL",
                       lambda: (m := re.search(r"live page: (http://\S+)", log_path.read_text())) and m.group(1),
                       60)
        assert url == f"http://127.0.0.1:{port}/live"

        def serving() -> bool:
            try:
                with urllib.request.urlopen(url, timeout=2) as r:
                    return bool(r.status == 200)
            except OSError:
                return False

        wait_for("the page to be served", serving, 60)
        browser.get(url)
        # Both charts drew, with a line per GPU over some seconds of frames.
        wait_for("both charts to draw", lambda: browser.execute_script(
            "const f = window.flopwatch; return ['chart-fpw', 'chart-cpt'].every(k => f.drawn[k] > 0"
            " && f.charts[k].data[0].length >= 10)"), 60)
        assert drawn_pixels(browser, "chart-fpw") > 2000 and drawn_pixels(browser, "chart-cpt") > 2000
        # The planted efficiency drop fires; the page lists it among the firing alerts.
        firing = wait_for("a firing efficiency_drift alert on the page", lambda: browser.execute_script(
            "const r = document.querySelector('#firing tr.firing[data-rule=\"efficiency_drift\"]');"
            "return r ? [r.dataset.id, r.textContent] : null"), DURATION_S + 10)
        assert "node-00/0" in firing[1]
        wait_for("the heatmap to show a cell", lambda: browser.execute_script(
            "return document.querySelectorAll('#heatmap td.cell[data-frames]').length"), 30)
        shown = browser.execute_script(
            "const f = window.flopwatch, out = {};"
            "for (const k of ['chart-fpw', 'chart-cpt']) { const u = f.charts[k];"
            "  out[k] = {keys: u.series.slice(1).map(s => s.label), data: u.data}; }"
            "const t = document.getElementById('heatmap');"
            "out.heatmap = {from_ms: +t.dataset.fromMs, to_ms: +t.dataset.toMs, cells: [...t.querySelectorAll("
            "'td.cell[data-frames]')].map(c => [c.dataset.model, c.dataset.region, +c.dataset.frames,"
            " +c.dataset.usdPerTflopsH, c.textContent])};"
            "out.rows = document.querySelectorAll('#gpus tbody tr[data-key]').length; return out;")
        ARTIFACTS.mkdir(parents=True, exist_ok=True)
        shot = ARTIFACTS / "live-page.png"
        assert browser.save_screenshot(str(shot))
        assert shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and shot.stat().st_size > 20_000
        assert shown["rows"] == 8  # the demo's 2 nodes x 4 GPUs
        assert demo.wait(timeout=DURATION_S + 120) == 0, log_path.read_text()[-3000:]
    finally:
        if demo.poll() is None:
            demo.kill()
            demo.wait()

    # The demo has stopped: its database opens here, and SQL gives what the page showed.
    db = base_settings.clickhouse_database
    backend = ChdbBackend(base_settings.chdb_path, db)
    try:
        _, rows = backend.rows(f"SELECT node, gpu, toUnixTimestamp64Milli(ts), flops_per_watt, cost_per_tflops "
                               f"FROM {db}.gpu_frames WHERE gpu != 'host'")
        frames = {(f"{n}/{g}", ts): (fpw, cpt) for n, g, ts, fpw, cpt in rows}
        checked = 0
        # The page draws the frames as sent; ClickHouse keeps them at their columns' resolution.
        for chart, column, scale in (("chart-fpw", 0, 1e-9), ("chart-cpt", 1, 1.0)):
            keys, data = shown[chart]["keys"], shown[chart]["data"]
            assert len(keys) == 8
            for i, key in enumerate(keys):
                for t_s, v in zip(data[0], data[i + 1], strict=True):
                    if v is None:
                        continue
                    sql = frames[(key, round(t_s * 1000))][column]
                    name = ("flops_per_watt", "cost_per_tflops")[column]
                    assert sql is not None and stored_as(name, sql, v / scale), (chart, key, t_s, v, sql)
                    checked += 1
        assert checked >= 2 * 8 * 10
        h = shown["heatmap"]
        names, cells = backend.rows(heatmap_sql(db, "current", base_settings.grid_ms, h["from_ms"], h["to_ms"]))
        want = {(r[0], r[1]): dict(zip(names, r, strict=True)) for r in cells}
        assert {(m, r) for m, r, *_ in h["cells"]} == set(want) == {("H200", "us-east")}
        for model, region, n, usd_per_tflops_h, text in h["cells"]:
            w = want[(model, region)]
            assert n == w["frames"] > 0
            assert usd_per_tflops_h == pytest.approx(w["usd_per_tflops_h"], rel=1e-9)
            assert text == f"{w['usd_per_tflops_h']:.4f}"
        _, det = backend.rows(f"SELECT count() FROM {db}.detections WHERE id = '{firing[0]}' AND state = 'firing'")
        assert det[0][0] >= 1  # the alert the page showed is the one the worker wrote
    finally:
        backend.close()
