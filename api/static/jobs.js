// gemmtune jobs page: while any job is queued or running, re-read the page every few seconds
// and swap its live sections in place (no reload), until every job has ended.
"use strict";

function gemmtuneJobs(openJobs) {
  const POLL_MS = 3000;
  const live = document.getElementById("live-indicator");
  const setLive = (on) => { if (live) live.hidden = !on; };
  if (!openJobs) return;
  setLive(true);
  const tick = async () => {
    try {
      const r = await fetch(location.href, { headers: { Accept: "text/html" } });
      if (r.ok) {
        const doc = new DOMParser().parseFromString(await r.text(), "text/html");
        document.querySelectorAll("[data-live][id]").forEach((el) => {
          const fresh = doc.getElementById(el.id);
          if (fresh) el.replaceWith(fresh);
        });
        // read from this page: replaceWith moved the fresh sections out of `doc`
        const count = (state) => Number(document.getElementById(`jobs-${state}`)?.textContent || 0);
        const queued = count("queued");
        const running = count("running");
        if (!queued && !running) { setLive(false); return; }
      }
    } catch (err) {
      console.warn("gemmtune: refresh failed, retrying", err);
    }
    setTimeout(tick, POLL_MS);
  };
  setTimeout(tick, POLL_MS);
}
