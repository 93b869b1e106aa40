"""The dashboard in headless Chromium (Debian's package) on a real uvicorn server.

Checks that plotly draws (its SVG is in the page), that no page logs a console error, that the
overview links through to a run, that a running run's page refreshes itself as trials land, that
plotly's mode bar (shown on hover) covers no cuBLAS label, legend or colour bar, that the run
page's top-configs table shows every key=value of the longest config inside its panel, and that a
problem measured on two GPU models overlays them in one chart (one sentence instead with one model).
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import db
import httpx
import kernels
import pytest
from test_api_support import STANDIN_GPU, Server, tune_into

pytestmark = pytest.mark.browser

CHROMIUM = os.environ.get("GEMMTUNE_CHROMIUM") or shutil.which("chromium") or "/usr/bin/chromium"
# Without the background-networking flags Chromium keeps calling home, which a closed network punishes.
CHROMIUM_ARGS = [
    "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
    "--disable-background-networking", "--disable-component-update", "--disable-sync",
]  # fmt: skip

if not Path(CHROMIUM).exists():
    pytest.skip(f"no Chromium at {CHROMIUM} (apt-get install -y chromium)", allow_module_level=True)
sync_api = pytest.importorskip("playwright.sync_api")

SHAPE = (256, 256, 256)
WIDE = "splitk"  # the family with the most parameters: the longest config in the top-configs table
OTHER_GPU = "Stand-in GPU B"
CUBLAS = {STANDIN_GPU: 18_000.0, OTHER_GPU: 24_000.0}  # the stand-in's, and a faster one recorded for B


@pytest.fixture(scope="module")
def tuned(tmp_path_factory):
    url = f"sqlite:///{tmp_path_factory.mktemp('browser')}/results.sqlite"
    return tune_into(url, [("naive", SHAPE), ("blocktile2d", SHAPE), (WIDE, (512, 512, 512))], trials=12)


@pytest.fixture(scope="module")
def server(tuned):
    s = Server(tuned.url)
    yield s
    s.stop()


@pytest.fixture(scope="module")
def two_models(tmp_path_factory):
    """A server over one problem measured on two GPU models: different families (so different
    searches and bests), and B with its own, faster cuBLAS baseline recorded after the stand-in's."""
    url = f"sqlite:///{tmp_path_factory.mktemp('models')}/results.sqlite"
    tune_into(url, [("naive", SHAPE)], trials=12)
    tune_into(url, [("blocktile2d", SHAPE)], trials=12, gpu_name=OTHER_GPU, gpu_uuid="GPU-00000000-stand-in-b")
    with db.open_database(url) as database:
        [gpu] = database.find_gpus(OTHER_GPU)
        m, n, k = SHAPE
        gflops = CUBLAS[OTHER_GPU]
        database.add_baseline(gpu_id=gpu.id, problem_id=database.ensure_problem(*SHAPE), time_median_ms=2e-6 * m * n * k / gflops,
                              gflops=gflops)  # fmt: skip
    s = Server(url)
    yield s
    s.stop()


@pytest.fixture(scope="module")
def browser(tmp_path_factory):
    with sync_api.sync_playwright() as p:
        context = p.chromium.launch_persistent_context(
            str(tmp_path_factory.mktemp("chromium-profile")),  # a fresh user-data dir
            executable_path=CHROMIUM, args=CHROMIUM_ARGS, headless=True, viewport={"width": 1400, "height": 900},
        )  # fmt: skip
        yield context
        context.close()


@pytest.fixture
def page(browser):
    """A tab that records console errors and uncaught exceptions; the test fails on any."""
    tab = browser.new_page()
    errors: list[str] = []
    tab.on("console", lambda m: errors.append(f"console.{m.type}: {m.text}") if m.type == "error" else None)
    tab.on("pageerror", lambda e: errors.append(f"uncaught: {e}"))
    tab.errors = errors
    yield tab
    tab.close()
    assert not errors, errors


def wait_for_plots(page, ids: list[str]) -> None:
    for plot_id in ids:
        # plotly renders into <svg class="main-svg"> inside the div once it has drawn
        page.wait_for_selector(f"#{plot_id} svg.main-svg", state="attached", timeout=15_000)


def boxes(page, selector: str) -> list[dict]:
    return page.eval_on_selector_all(selector, "els => els.map(e => e.getBoundingClientRect().toJSON())"
                                     ".filter(b => b.width > 0 && b.height > 0)")


def overlaps(a: dict, b: dict) -> bool:
    return a["left"] < b["right"] and b["left"] < a["right"] and a["top"] < b["bottom"] and b["top"] < a["bottom"]


def assert_mode_bar_clear(page, plot_id: str, labels: list[str]) -> int:
    """Hover the plot (plotly shows its mode bar then) and check the bar covers none of the labels
    (the cuBLAS annotation, the legend, the colour bar); returns how many labels were checked."""
    page.hover(f"#{plot_id} .nsewdrag")
    page.wait_for_selector(f"#{plot_id} .modebar-container .modebar-btn", state="visible", timeout=5_000)
    [bar] = boxes(page, f"#{plot_id} .modebar")
    checked = 0
    for selector in labels:
        for box in boxes(page, f"#{plot_id} {selector}"):
            assert not overlaps(bar, box), (plot_id, selector, bar, box)
            checked += 1
    return checked


def test_overview_draws_and_clicks_through_to_a_run(page, server, tuned, tmp_path):
    page.goto(server.base + "/")
    wait_for_plots(page, ["overview-plot"])
    assert page.locator("#overview-plot .bars path").count() >= 1  # the bars were drawn, not just axes
    assert STANDIN_GPU in page.inner_text("#best-matrix")
    page.screenshot(path=str(tmp_path / "overview.png"), full_page=True)

    run_id = tuned.run_ids[0]
    page.click(f'#runs-table a[href="/runs/{run_id}"]')
    page.wait_for_url(f"**/runs/{run_id}")
    wait_for_plots(page, ["plot-progress", "plot-occupancy", "plot-params"])
    params = kernels.FAMILIES["naive"].params
    # one x axis title per parameter in the parameter grid
    titles = page.locator('#plot-params text[class^="x"][class$="title"]').all_text_contents()
    assert sorted(titles) == sorted(p.name for p in params)
    assert "GFLOP/s" in page.inner_text("#top-configs")
    assert assert_mode_bar_clear(page, "plot-progress", ["g.annotation", "g.legend"]) == 1  # the cuBLAS label
    assert assert_mode_bar_clear(page, "plot-occupancy", ["g.colorbar"]) == 1
    page.screenshot(path=str(tmp_path / "run.png"), full_page=True)


def test_the_top_configs_table_shows_the_whole_config(page, server, tuned, tmp_path):
    """The family with the most parameters: every key=value of its configs lies inside the panel
    (the config column wraps), and the table is no wider than its panel."""
    [run_id] = [r for r in tuned.run_ids if r == tuned.run_ids[-1]]
    page.goto(f"{server.base}/runs/{run_id}")
    wait_for_plots(page, ["plot-progress"])
    page.screenshot(path=str(tmp_path / "run-wide.png"), full_page=True)
    [panel] = boxes(page, "#top-configs")
    [table] = boxes(page, "#top-configs table")
    pairs = boxes(page, "#top-configs .config .kv")
    params = kernels.FAMILIES[WIDE].params
    assert len(pairs) >= 3 * len(params)  # several configs, every parameter of each
    assert table["right"] <= panel["right"]
    for pair in pairs:
        assert panel["left"] <= pair["left"] and pair["right"] <= panel["right"], (pair, panel)
    texts = page.locator("#top-configs tbody tr").first.locator(".config .kv").all_text_contents()
    assert [t.split("=")[0] for t in texts] == [p.name for p in params]


def test_problem_page_compares_families(page, server, tmp_path):
    page.goto(server.base + "/problems/1")
    wait_for_plots(page, ["plot-families", "plot-runs"])
    bars = page.locator("#plot-families .bars path")
    assert bars.count() == 2  # naive and blocktile2d
    assert "cuBLAS" in page.inner_text("#plot-families")
    assert assert_mode_bar_clear(page, "plot-families", ["g.annotation"]) == 1  # the cuBLAS label
    # the legend (one entry per run) and the cuBLAS label
    assert assert_mode_bar_clear(page, "plot-runs", ["g.annotation", "g.legend"]) == 2
    # one GPU model measured it: a sentence where the models' overlay would be
    assert "Only " + STANDIN_GPU in page.inner_text("#models-overlay-note")
    assert page.locator("#plot-models").count() == 0
    page.screenshot(path=str(tmp_path / "problem.png"), full_page=True)


def test_problem_page_overlays_the_gpu_models(page, two_models, tmp_path):
    """On the GPU picker and on a model's own page: one best-so-far trace per model, ending at that
    model's best, its cuBLAS dashed in its colour, a legend naming both clear of the mode bar."""
    [problem] = httpx.get(f"{two_models.base}/api/problems").json()
    models = httpx.get(f"{two_models.base}/api/problems/{problem['id']}/models").json()
    assert {c["gpu"] for c in models} == set(CUBLAS)
    for query in ("", f"?gpu={OTHER_GPU}"):
        page.goto(f"{two_models.base}/problems/{problem['id']}{query}")
        wait_for_plots(page, ["plot-models"])
        traces = page.evaluate("document.getElementById('plot-models').data.map(t =>"
                               " ({name: t.name, group: t.legendgroup, color: t.line.color, dash: t.line.dash || null, y: t.y}))")
        curves = {t["name"]: t for t in traces if t["dash"] is None}
        assert sorted(curves) == sorted(CUBLAS)  # one trace per model
        for c in models:
            assert curves[c["gpu"]]["y"][-1] == pytest.approx(c["best_gflops"])
            [cublas] = [t for t in traces if t["dash"] == "dash" and t["group"] == c["gpu"]]
            assert cublas["color"] == curves[c["gpu"]]["color"] and cublas["y"] == [CUBLAS[c["gpu"]]] * 2
        assert len({t["color"] for t in curves.values()}) == 2
        legend = page.locator("#plot-models g.legend text.legendtext").all_text_contents()
        assert sorted(legend) == sorted(CUBLAS)
        assert assert_mode_bar_clear(page, "plot-models", ["g.legend", "g.annotation"]) == 1  # the legend
        page.screenshot(path=str(tmp_path / f"problem-models{'-' + OTHER_GPU[-1] if query else ''}.png"), full_page=True)


def test_running_run_refreshes_as_trials_land(page, browser, server, tuned):
    """A run in progress: its page and the overview poll the API and redraw without a reload."""
    fam = kernels.FAMILIES["naive"]
    configs = fam.sample_accepted(6, seed=7)
    with db.open_database(tuned.url) as database:
        gpu_id = database.ensure_gpu(db.GpuInfo(STANDIN_GPU, "GPU-00000000-stand-in", "9.0", 132, 80 << 30, 1980,
                                                "stand-in", "stand-in", "stand-in"))  # fmt: skip
        run_id = database.start_run(
            gpu_id=gpu_id, problem_id=database.ensure_problem(*SHAPE), family_id=database.ensure_family(fam.name, fam.source_hash),
            sampler="tpe", seed=1, budget={"trials": 6}, host="test", command="live test", study_name=None,
        )  # fmt: skip

        def add(i: int) -> None:
            database.add_trial(run_id, db.TrialRecord(number=i, params=configs[i], state="ok", time_median_ms=1.0,
                                                      gflops=1000.0 * (i + 1), occupancy=0.5, registers=40))  # fmt: skip

        add(0)
        page.goto(f"{server.base}/runs/{run_id}")
        wait_for_plots(page, ["plot-progress"])
        assert page.is_visible("#live-indicator")
        assert page.inner_text("#n-trials") == "1"
        marker = page.evaluate("window.__marker = 1")  # survives only if the page is not reloaded

        for i in range(1, 4):
            add(i)
        page.wait_for_function("document.querySelector('#n-trials').textContent.trim() === '4'", timeout=15_000)
        # the best-so-far line follows: its last point is the new best (4000 GFLOP/s)
        page.wait_for_function(
            "(() => { const d = document.getElementById('plot-progress').data;"
            " return d && d[1].y[d[1].y.length - 1] === 4000; })()",
            timeout=15_000,
        )
        overview = browser.new_page()
        overview.goto(server.base + "/")
        row = f'#runs-table tr:has(a[href="/runs/{run_id}"])'
        assert "running" in overview.inner_text(row) and overview.is_visible("#live-indicator")

        database.finish_run(run_id, "finished")
        page.wait_for_function("document.querySelector('#run-state').textContent.includes('finished')", timeout=15_000)
        page.wait_for_selector("#live-indicator", state="hidden", timeout=15_000)
        assert page.evaluate("window.__marker") == 1 and marker == 1
        overview.wait_for_function(
            f"document.querySelector('{row}').textContent.includes('finished')", timeout=15_000
        )
        overview.wait_for_selector("#live-indicator", state="hidden", timeout=15_000)
        overview.close()


def test_a_run_whose_tuner_died_turns_interrupted_without_another_tuner(page, server, tuned):
    """A tuner killed with SIGKILL stops its run's heartbeat: once the run's own stale-after
    time has passed, its page (polling the API) and the API show it interrupted; no tuner has
    to start for that."""
    fam = kernels.FAMILIES["naive"]
    with db.open_database(tuned.url) as database:
        gpu_id = database.ensure_gpu(db.GpuInfo(STANDIN_GPU, "GPU-00000000-stand-in", "9.0", 132, 80 << 30, 1980,
                                                "stand-in", "stand-in", "stand-in"))  # fmt: skip
        run_id = database.start_run(
            gpu_id=gpu_id, problem_id=database.ensure_problem(*SHAPE), family_id=database.ensure_family(fam.name, fam.source_hash),
            sampler="tpe", seed=1, budget={"trials": 6}, host="test", command="killed", study_name=None, stale_after_s=4.0,
        )  # fmt: skip
    page.goto(f"{server.base}/runs/{run_id}")
    assert "running" in page.inner_text("#run-state") and page.is_visible("#live-indicator")
    page.wait_for_function("document.querySelector('#run-state').textContent.includes('interrupted')", timeout=20_000)
    page.wait_for_selector("#live-indicator", state="hidden", timeout=15_000)
    run = httpx.get(f"{server.base}/api/runs/{run_id}").json()
    assert run["state"] == "interrupted" and run["ended_at"] is not None


def test_a_workload_page_follows_its_problems_tuning(page, server, tuned):
    """While a problem of a workload is being tuned, its page polls the API and shows each
    problem's runs and measured trials without a reload, and stops once none is running."""
    fam = kernels.FAMILIES["naive"]
    configs = fam.sample_accepted(2, seed=11)
    with db.open_database(tuned.url) as database:
        workload_id = database.save_workload("live.json", {
            "format": "gemmtune-workload", "version": 1, "gpu": STANDIN_GPU, "label": "live",
            "problems": [{"m": SHAPE[0], "n": SHAPE[1], "k": SHAPE[2], "layout": "nn", "batch": 1,
                          "count": 3, "share": 1.0}]})  # fmt: skip
        gpu_id = database.ensure_gpu(db.GpuInfo(STANDIN_GPU, "GPU-00000000-stand-in", "9.0", 132, 80 << 30, 1980,
                                                "stand-in", "stand-in", "stand-in"))  # fmt: skip
        before = httpx.get(f"{server.base}/api/workloads/{workload_id}").json()["problems"][0]["tuning"]
        assert before["running"] == 0 and before["runs"] >= 1  # the module's finished runs of SHAPE
        run_id = database.start_run(
            gpu_id=gpu_id, problem_id=database.ensure_problem(*SHAPE), family_id=database.ensure_family(fam.name, fam.source_hash),
            sampler="tpe", seed=1, budget={"trials": 2}, host="test", command="workload test", study_name=None,
        )  # fmt: skip
        cell = "#workload-table tbody tr:first-child td.tuning"
        page.goto(f"{server.base}/workloads/{workload_id}")
        assert page.inner_text(cell).startswith("running") and page.is_visible("#live-indicator")
        assert f"{before['measured']} measured" in page.inner_text(cell)
        marker = page.evaluate("window.__marker = 1")  # survives only if the page is not reloaded
        database.add_trial(run_id, db.TrialRecord(number=0, params=configs[0], state="ok", time_median_ms=1.0,
                                                  gflops=1000.0, occupancy=0.5, registers=40))  # fmt: skip
        page.wait_for_function(f"document.querySelector('{cell}').textContent.includes('{before['measured'] + 1} measured')",
                               timeout=15_000)
        database.finish_run(run_id, "finished")
        page.wait_for_function(f"document.querySelector('{cell}').textContent.startsWith('done')", timeout=15_000)
        page.wait_for_selector("#live-indicator", state="hidden", timeout=15_000)
        assert page.evaluate("window.__marker") == 1 and marker == 1
        assert f"in {before['runs'] + 1} runs" in page.inner_text(cell)
