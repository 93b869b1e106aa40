// gemmtune dashboard: draws the plots from the JSON API and keeps pages of running runs fresh.
"use strict";

const gemmtune = (() => {
  const POLL_MS = 3000; // a running search adds a trial every second or so
  const PAGE = 1000; // the API's largest trial page
  const COLORS = ["#1f6fb2", "#d9730d", "#2e8b57", "#b23a48", "#6a4c93", "#8c6d1f", "#0f8b8d", "#7a7a7a"];

  // Plotly draws its mode bar (zoom, pan, download) over the top right corner of a chart while the
  // mouse is on it: about 26 px high, 220 px wide. Every chart keeps this band above its plot area
  // free of labels and legends (annotations go left or below it), so the bar never covers one.
  const MODEBAR_BAND = 32;
  const baseLayout = (extra) =>
    Object.assign(
      {
        margin: { l: 62, r: 18, t: MODEBAR_BAND, b: 44 },
        font: { family: "-apple-system, 'Segoe UI', Roboto, 'Helvetica Neue', Arial, sans-serif", size: 11, color: "#24292f" },
        paper_bgcolor: "#fff",
        plot_bgcolor: "#fff",
        hovermode: "closest",
        showlegend: false,
        xaxis: { gridcolor: "#eef0f3", zeroline: false, linecolor: "#c9ced6", ticks: "outside" },
        yaxis: { gridcolor: "#eef0f3", zeroline: false, linecolor: "#c9ced6", ticks: "outside", title: { text: "GFLOP/s" }, rangemode: "tozero" },
      },
      extra || {}
    );
  const plotConfig = { displaylogo: false, responsive: true, modeBarButtonsToRemove: ["lasso2d", "select2d"] };

  const fmtG = (v) => (v == null ? "–" : v >= 100 ? Math.round(v).toLocaleString("en-US") : v.toFixed(1));
  const fmtF = (v) => (v == null ? "–" : (100 * v).toFixed(1) + "%");
  const cfgText = (p) => Object.entries(p).map(([k, v]) => `${k}=${v}`).join(" ");

  async function getJSON(url) {
    const r = await fetch(url, { headers: { Accept: "application/json" } });
    if (!r.ok) throw new Error(`${url}: HTTP ${r.status}`);
    return r.json();
  }

  async function allTrials(runId, state) {
    const out = [];
    for (let offset = 0; ; offset += PAGE) {
      const q = `offset=${offset}&limit=${PAGE}` + (state ? `&state=${state}` : "");
      const page = await getJSON(`/api/runs/${runId}/trials?${q}`);
      out.push(...page.items);
      if (page.items.length < PAGE) return out;
    }
  }

  function emptyNote(el, text) {
    el.innerHTML = `<div class="plot-empty">${text}</div>`;
  }

  // Horizontal dashed cuBLAS line across an x range.
  function cublasShape(cublas, axis) {
    return {
      type: "line", xref: axis || "paper", x0: 0, x1: 1, yref: "y", y0: cublas, y1: cublas,
      line: { color: "#b23a48", width: 1.5, dash: "dash" },
    };
  }
  // At the left end of the line: the mode bar sits at the top right.
  function cublasLabel(cublas) {
    return {
      xref: "paper", x: 0, xanchor: "left", yref: "y", y: cublas, yanchor: "bottom", showarrow: false,
      text: `cuBLAS ${fmtG(cublas)} GFLOP/s`, font: { color: "#b23a48", size: 10 },
    };
  }

  function bestSoFar(trials) {
    const xs = [], ys = [];
    let best = null;
    for (const t of trials) {
      if (t.state === "ok" && t.gflops != null && (best == null || t.gflops > best)) best = t.gflops;
      if (best != null) { xs.push(t.number); ys.push(best); }
    }
    return { xs, ys };
  }

  // ---- run page -------------------------------------------------------------------------------

  function drawProgress(el, trials, cublas) {
    const ok = trials.filter((t) => t.state === "ok" && t.gflops != null);
    if (!ok.length) return emptyNote(el, "No verified trial yet.");
    const bsf = bestSoFar(trials);
    const traces = [
      {
        x: ok.map((t) => t.number), y: ok.map((t) => t.gflops), mode: "markers", type: "scatter", name: "trial",
        marker: { size: 5, color: "#9db7d5" },
        text: ok.map((t) => `${fmtF(t.fraction_of_cublas)} of cuBLAS<br>${cfgText(t.params)}`),
        hovertemplate: "trial %{x}: %{y:,.0f} GFLOP/s<br>%{text}<extra></extra>",
      },
      {
        x: bsf.xs, y: bsf.ys, mode: "lines", type: "scatter", name: "best so far", line: { shape: "hv", color: "#1f6fb2", width: 2 },
        hovertemplate: "best after trial %{x}: %{y:,.0f} GFLOP/s<extra></extra>",
      },
    ];
    const layout = baseLayout({ xaxis: Object.assign(baseLayout().xaxis, { title: { text: "trial number" } }) });
    if (cublas) { layout.shapes = [cublasShape(cublas)]; layout.annotations = [cublasLabel(cublas)]; }
    Plotly.react(el, traces, layout, plotConfig);
  }

  function drawOccupancy(el, trials) {
    const ok = trials.filter((t) => t.state === "ok" && t.gflops != null && t.occupancy != null);
    if (!ok.length) return emptyNote(el, "No verified trial with an occupancy yet.");
    const regs = ok.map((t) => t.registers);
    const traces = [{
      x: ok.map((t) => t.occupancy), y: ok.map((t) => t.gflops), mode: "markers", type: "scatter",
      marker: {
        size: 7, opacity: 0.8, color: regs.map((r) => (r == null ? 0 : r)), colorscale: "Viridis",
        showscale: true, colorbar: { title: { text: "regs", side: "right" }, thickness: 10 },
      },
      text: ok.map((t) => `trial ${t.number} · ${t.registers ?? "?"} regs · ${fmtF(t.fraction_of_cublas)} of cuBLAS<br>${cfgText(t.params)}`),
      hovertemplate: "occupancy %{x:.0%}: %{y:,.0f} GFLOP/s<br>%{text}<extra></extra>",
    }];
    const layout = baseLayout({
      xaxis: Object.assign(baseLayout().xaxis, { title: { text: "theoretical occupancy" }, tickformat: ".0%", range: [0, 1.05] }),
    });
    Plotly.react(el, traces, layout, plotConfig);
  }

  // One small panel per parameter: value (categorical, ordered) against GFLOP/s.
  function drawParams(el, trials, paramNames) {
    const ok = trials.filter((t) => t.state === "ok" && t.gflops != null);
    if (!ok.length || !paramNames.length) return emptyNote(el, "No verified trial yet.");
    const cols = Math.min(paramNames.length, 4);
    const rows = Math.ceil(paramNames.length / cols);
    const traces = [];
    const layout = baseLayout({
      grid: { rows, columns: cols, pattern: "independent", xgap: 0.08, ygap: 0.28 },
      height: Math.max(260, rows * 210),
      margin: { l: 62, r: 18, t: MODEBAR_BAND, b: 36 },
      annotations: [],
    });
    paramNames.forEach((name, i) => {
      const ax = i === 0 ? "" : String(i + 1);
      const values = [...new Set(ok.map((t) => t.params[name]))].sort((a, b) => a - b);
      const best = values.map((v) => Math.max(...ok.filter((t) => t.params[name] === v).map((t) => t.gflops)));
      traces.push({
        x: ok.map((t) => String(t.params[name])), y: ok.map((t) => t.gflops), xaxis: "x" + ax, yaxis: "y" + ax,
        type: "scatter", mode: "markers", marker: { size: 5, color: COLORS[i % COLORS.length], opacity: 0.55 },
        text: ok.map((t) => `trial ${t.number} · ${fmtF(t.fraction_of_cublas)} of cuBLAS`),
        hovertemplate: `${name}=%{x}: %{y:,.0f} GFLOP/s<br>%{text}<extra></extra>`,
      });
      traces.push({
        x: values.map(String), y: best, xaxis: "x" + ax, yaxis: "y" + ax, type: "scatter", mode: "lines",
        line: { color: COLORS[i % COLORS.length], width: 1.5 }, hoverinfo: "skip",
      });
      layout["xaxis" + ax] = {
        type: "category", categoryorder: "array", categoryarray: values.map(String), title: { text: name, standoff: 4 },
        linecolor: "#c9ced6", gridcolor: "#eef0f3", ticks: "outside",
      };
      layout["yaxis" + ax] = {
        rangemode: "tozero", gridcolor: "#eef0f3", linecolor: "#c9ced6", ticks: "outside",
        title: i % cols === 0 ? { text: "GFLOP/s" } : undefined,
      };
    });
    Plotly.react(el, traces, layout, plotConfig);
  }

  async function refreshRunPlots(runId, paramNames) {
    const [run, trials] = await Promise.all([getJSON(`/api/runs/${runId}`), allTrials(runId)]);
    drawProgress(document.getElementById("plot-progress"), trials, run.cublas_gflops);
    drawOccupancy(document.getElementById("plot-occupancy"), trials);
    drawParams(document.getElementById("plot-params"), trials, paramNames);
    return run;
  }

  // Re-fetch this page and swap every [data-live] element in place: the server renders, we patch.
  async function swapLiveSections() {
    const r = await fetch(location.href, { headers: { Accept: "text/html" } });
    if (!r.ok) return;
    const doc = new DOMParser().parseFromString(await r.text(), "text/html");
    document.querySelectorAll("[data-live][id]").forEach((el) => {
      const fresh = doc.getElementById(el.id);
      if (fresh) el.replaceWith(fresh);
    });
  }

  function setLive(on) {
    const el = document.getElementById("live-indicator");
    if (el) el.hidden = !on;
  }

  // Poll `probe` every POLL_MS while `stillLive` holds; call `onChange` when its signature moves
  // away from `initial`, the signature of what the server rendered.
  function poll(initial, probe, signature, stillLive, onChange) {
    let last = initial;
    setLive(true);
    const tick = async () => {
      try {
        const value = await probe();
        const sig = signature(value);
        if (sig !== last) await onChange(value);
        last = sig;
        if (!stillLive(value)) { setLive(false); return; }
      } catch (err) {
        console.warn("gemmtune: refresh failed, retrying", err);
      }
      setTimeout(tick, POLL_MS);
    };
    setTimeout(tick, POLL_MS);
  }

  const runSignature = (run) => `${run.state}/${run.n_trials}`;

  function runPage(runId, state, nTrials, paramNames) {
    refreshRunPlots(runId, paramNames);
    if (state !== "running") return;
    poll(
      runSignature({ state, n_trials: nTrials }),
      () => getJSON(`/api/runs/${runId}`),
      runSignature,
      (run) => run.state === "running",
      async () => { await refreshRunPlots(runId, paramNames); await swapLiveSections(); }
    );
  }

  // ---- workload page --------------------------------------------------------------------------

  const workloadSignature = (w) =>
    w.problems.map((p) => `${p.tuning.runs}:${p.tuning.running}:${p.tuning.measured}:${p.served}`).join(",");

  // While one of its problems is being tuned, the page follows the tuning (each problem's runs
  // and measured trials, and what tuned kernels serve) without a reload.
  function workloadPage(w, apiUrl) {
    if (!w.running) return;
    poll(workloadSignature(w), () => getJSON(apiUrl), workloadSignature, (x) => x.running, swapLiveSections);
  }

  // ---- overview -------------------------------------------------------------------------------

  async function drawOverview() {
    const el = document.getElementById("overview-plot");
    if (!el) return;
    const cells = await getJSON("/api/overview");
    const gpus = [...new Set(cells.map((c) => c.gpu))].sort();
    const shapes = [...new Map(cells.map((c) => [c.problem.id, c.problem])).values()]
      .sort((a, b) => a.m - b.m || a.n - b.n || a.k - b.k);
    const label = (p) => `${p.m}×${p.n}×${p.k}`;
    const traces = [];
    gpus.forEach((g, i) => {
      const mine = shapes.map((p) => cells.find((c) => c.gpu === g && c.problem.id === p.id));
      traces.push({
        type: "bar", name: g, x: shapes.map(label), y: mine.map((c) => (c ? c.best_gflops : null)),
        marker: { color: COLORS[i % COLORS.length] },
        text: mine.map((c) => (c ? `${c.family} · ${fmtF(c.fraction_of_cublas)} of cuBLAS` : "")),
        hovertemplate: `${g}<br>%{x}: %{y:,.0f} GFLOP/s<br>%{text}<extra></extra>`,
        textposition: "inside", insidetextanchor: "middle", offsetgroup: String(i),
      });
      const withCublas = mine.map((c) => (c ? c.cublas_gflops : null));
      if (withCublas.some((v) => v != null)) {
        traces.push({
          type: "scatter", mode: "markers", name: `${g} cuBLAS`, x: shapes.map(label), y: withCublas,
          marker: { symbol: "diamond", size: 9, color: "#b23a48", line: { color: "#fff", width: 1 } },
          hovertemplate: `${g} cuBLAS<br>%{x}: %{y:,.0f} GFLOP/s<extra></extra>`, offsetgroup: String(i),
        });
      }
    });
    const layout = baseLayout({
      barmode: "group", showlegend: gpus.length > 1, legend: { orientation: "h", x: 0, y: 1, yanchor: "bottom" },
      xaxis: Object.assign(baseLayout().xaxis, { type: "category", title: { text: "problem M×N×K" } }),
    });
    Plotly.react(el, traces, layout, plotConfig);
  }

  const runsSignature = (runs) => runs.map((r) => `${r.id}:${r.state}:${r.n_trials}`).join(",");

  function overviewPage(runs) {
    drawOverview();
    if (!runs.some((r) => r.state === "running")) return;
    poll(
      runsSignature(runs),
      () => getJSON(`/api/runs?limit=${runs.length}`),
      runsSignature,
      (runs) => runs.some((r) => r.state === "running"),
      async () => { await swapLiveSections(); await drawOverview(); }
    );
  }

  // ---- problem page ---------------------------------------------------------------------------

  async function problemPage(cmp) {
    const famEl = document.getElementById("plot-families");
    if (!cmp.families.length) emptyNote(famEl, "No verified config on this problem yet.");
    else {
      const fams = cmp.families.slice().reverse(); // best at the top of a horizontal bar chart
      const layout = baseLayout({
        margin: { l: 110, r: 18, t: MODEBAR_BAND, b: 44 },
        xaxis: Object.assign(baseLayout().xaxis, { title: { text: "GFLOP/s" }, rangemode: "tozero" }),
        yaxis: { type: "category", automargin: true, linecolor: "#c9ced6" },
      });
      if (cmp.cublas_gflops) {
        layout.shapes = [{ type: "line", xref: "x", x0: cmp.cublas_gflops, x1: cmp.cublas_gflops, yref: "paper", y0: 0, y1: 1,
          line: { color: "#b23a48", width: 1.5, dash: "dash" } }];
        layout.annotations = [{ xref: "x", x: cmp.cublas_gflops, yref: "paper", y: 1, yanchor: "bottom", showarrow: false,
          text: `cuBLAS ${fmtG(cmp.cublas_gflops)}`, font: { color: "#b23a48", size: 10 } }];
        layout.margin.t = MODEBAR_BAND + 16; // the label above the plot area, below the mode bar's band
      }
      Plotly.react(famEl, [{
        type: "bar", orientation: "h", y: fams.map((f) => f.family), x: fams.map((f) => f.gflops),
        marker: { color: fams.map((f, i) => COLORS[(fams.length - 1 - i) % COLORS.length]) },
        text: fams.map((f) => `${fmtG(f.gflops)} · ${fmtF(f.fraction_of_cublas)}`), textposition: "auto",
        hovertemplate: "%{y}: %{x:,.0f} GFLOP/s<extra></extra>",
      }], layout, plotConfig);
    }

    const runsEl = document.getElementById("plot-runs");
    const runs = cmp.runs.filter((r) => r.n_ok > 0).slice(0, 12);
    if (!runs.length) return emptyNote(runsEl, "No run with a verified trial yet.");
    const families = [...new Set(runs.map((r) => r.family))];
    const traces = [];
    for (const run of runs) {
      const bsf = bestSoFar(await allTrials(run.id, "ok"));
      const color = COLORS[families.indexOf(run.family) % COLORS.length];
      traces.push({
        type: "scatter", mode: "lines", x: bsf.xs, y: bsf.ys, name: `#${run.id} ${run.family}`,
        line: { shape: "hv", width: 2, color }, hovertemplate: `run #${run.id} ${run.family}<br>trial %{x}: %{y:,.0f} GFLOP/s<extra></extra>`,
      });
    }
    const layout = baseLayout({ showlegend: true, legend: { font: { size: 10 }, y: 1, yanchor: "top" },
      xaxis: Object.assign(baseLayout().xaxis, { title: { text: "trial number" } }) });
    if (cmp.cublas_gflops) { layout.shapes = [cublasShape(cmp.cublas_gflops)]; layout.annotations = [cublasLabel(cmp.cublas_gflops)]; }
    Plotly.react(runsEl, traces, layout, plotConfig);
  }

  // One trace per GPU model: best-so-far GFLOP/s of the run that found that model's best, with the
  // model's own cuBLAS dashed in its colour. Absolute GFLOP/s rather than fractions of cuBLAS: the
  // gap between models is what one buys, and each model's dashed line still shows its fraction by
  // eye (as fractions every cuBLAS line would fall on 1). The curves show whether each best had
  // converged (a flat tail) or was still climbing, i.e. whether a slower model is only under-tuned.
  async function modelsOverlay(problemId) {
    const el = document.getElementById("plot-models");
    const models = await getJSON(`/api/problems/${problemId}/models`);
    const runs = await Promise.all(models.map((c) => allTrials(c.run_id, "ok")));
    const curves = runs.map(bestSoFar);
    const lastTrial = Math.max(...curves.map((b) => b.xs[b.xs.length - 1]));
    const traces = [];
    models.forEach((c, i) => {
      const color = COLORS[i % COLORS.length];
      const { xs, ys } = curves[i];
      traces.push({
        type: "scatter", mode: "lines", x: xs, y: ys, name: c.gpu, legendgroup: c.gpu,
        line: { shape: "hv", width: 2, color },
        text: ys.map((y) => (c.cublas_gflops ? `${fmtF(y / c.cublas_gflops)} of its cuBLAS` : "no cuBLAS baseline")),
        hovertemplate: `${c.gpu} · run #${c.run_id} ${c.family}<br>trial %{x}: %{y:,.0f} GFLOP/s, %{text}<extra></extra>`,
      });
      // A trace rather than a layout shape so it hovers, and hides with its model from the legend.
      if (c.cublas_gflops) {
        traces.push({
          type: "scatter", mode: "lines", x: [0, lastTrial], y: [c.cublas_gflops, c.cublas_gflops],
          name: `${c.gpu} cuBLAS`, legendgroup: c.gpu, showlegend: false, line: { width: 1.5, dash: "dash", color },
          hovertemplate: `${c.gpu} cuBLAS: %{y:,.0f} GFLOP/s<extra></extra>`,
        });
      }
    });
    // The legend right of the plot area, its top level with the area's: below the mode bar's band.
    const layout = baseLayout({ showlegend: true, legend: { y: 1, yanchor: "top" },
      xaxis: Object.assign(baseLayout().xaxis, { title: { text: "trial number (each model's best run)" } }) });
    Plotly.react(el, traces, layout, plotConfig);
  }

  return { runPage, overviewPage, problemPage, modelsOverlay, workloadPage };
})();
