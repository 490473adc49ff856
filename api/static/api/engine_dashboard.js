/* The engine dashboard (templates/admin/engine_dashboard.html): renders the snapshot embedded in
   the page, then polls the JSON endpoint every 2 s for a new one and the charts' new samples.
   Prefix-cache entries are evicted through a confirmation dialog and a CSRF-checked POST. */
(function () {
  "use strict";
  var C = window.EngineDashboardCharts, U = C.units;
  var root = document.getElementById("ed-root");
  var DATA_URL = root.getAttribute("data-data-url"), EVICT_URL = root.getAttribute("data-evict-url");
  var POLL_MS = 2000, PENDING_MS = 30000, ENTRIES_FOLDED = 10;
  var COLORS = ["#417690", "#d97706", "#15803d", "#b91c1c", "#7c3aed", "#0e7490"];
  var MATCH_TYPES = {exact: "Exact", prefix: "Prefix", supersequence: "Supersequence", lcp: "Longest Common Prefix",
                     hit: "Hit (Paged)", ssd_hit: "SSD Hit", ssd_pending: "SSD Pending", miss: "Miss"};
  var TIERS = {ram: "Memory", paged: "Paged", ssd: "SSD"};
  var history = {};  // worker id -> samples, oldest first (the last history_s seconds)
  var pending = {};  // "worker key" -> when its eviction was requested (ms)
  var unfolded = {};  // worker id -> true where every entry its heartbeat lists is shown
  var lastData = null, updates = 0, evictTarget = null;

  function el(tag, text, cls) {
    var e = document.createElement(tag);
    if (text !== undefined && text !== null) e.textContent = text;
    if (cls) e.className = cls;
    return e;
  }
  function title(s) { return String(s).replace(/_/g, " ").replace(/\b\w/g, function (c) { return c.toUpperCase(); }); }
  function shortId(id) { id = String(id); return id.length > 14 ? id.slice(0, 12) + "…" : id; }
  function last(samples, field) {
    for (var i = samples.length - 1; i >= 0; i--) if (samples[i][field] !== null && samples[i][field] !== undefined) return samples[i][field];
    return null;
  }

  function kvTable(caption, rows) {
    var t = el("table", null, "ed-table ed-kv");
    if (caption) t.appendChild(el("caption", caption));
    rows.forEach(function (r) {
      var tr = el("tr"); tr.appendChild(el("th", r[0])); tr.appendChild(el("td", r[1])); t.appendChild(tr);
    });
    return t;
  }

  function dataTable(headers, rows, numeric) {
    var t = el("table", null, "ed-table"), head = el("thead"), hr = el("tr"), body = el("tbody");
    headers.forEach(function (h, i) { hr.appendChild(el("th", h, numeric[i] ? "ed-num" : null)); });
    head.appendChild(hr); t.appendChild(head); t.appendChild(body);
    rows.forEach(function (r) { body.appendChild(r); });
    if (!rows.length) {
      var tr = el("tr"), td = el("td", "None right now.", "ed-quiet");
      td.colSpan = headers.length; tr.appendChild(td); body.appendChild(tr);
    }
    var wrap = el("div", null, "ed-scroll"); wrap.appendChild(t);
    return wrap;
  }

  function row(cells, numeric) {
    var tr = el("tr");
    cells.forEach(function (c, i) {
      var td = el("td", null, numeric[i] ? "ed-num" : null);
      if (c instanceof Node) td.appendChild(c); else td.textContent = c;
      tr.appendChild(td);
    });
    return tr;
  }

  function mergeHistory(d) {
    var oldest = d.generated_at - d.history_s, next = {};
    d.workers.forEach(function (w) {
      var mine = history[w.worker_id] || [], lastT = mine.length ? mine[mine.length - 1].t : -Infinity;
      (d.history[w.worker_id] || []).forEach(function (s) { if (s.t > lastT) mine.push(s); });
      next[w.worker_id] = mine.filter(function (s) { return s.t > oldest; });
    });
    history = next;  // a worker that is gone leaves the charts
  }

  function hitRate(workers) {
    var hits = 0, misses = 0;
    workers.forEach(function (w) { if (w.cache) { hits += w.cache.hits || 0; misses += w.cache.misses || 0; } });
    return hits + misses ? hits / (hits + misses) : null;
  }

  function card(label, value) {
    var c = el("div", null, "ed-card");
    c.appendChild(el("div", label, "ed-label")); c.appendChild(el("div", value, "ed-value"));
    return c;
  }

  function renderSummary(d) {
    document.getElementById("ed-summary").replaceChildren(
      card("Live Workers", U.count(d.workers.length)),
      card("Queued Jobs", U.count(d.jobs.queued)),
      card("Running Jobs", U.count(d.engines.running)),
      card("Generation Speed", U.rate(d.throughput.engine_tokens_per_second)),
      card("Jobs Finished (Last 60 s)", U.count(d.throughput.jobs)),
      card("Prefix-Cache Hit Rate", U.percent(hitRate(d.workers)))
    );
  }

  function spacing() {
    var gaps = [];
    Object.keys(history).forEach(function (id) {
      var s = history[id];
      for (var i = 1; i < s.length; i++) gaps.push(s[i].t - s[i - 1].t);
    });
    gaps.sort(function (a, b) { return a - b; });
    return gaps.length ? gaps[Math.floor(gaps.length / 2)] : 2;
  }

  function chartWindow(d) {
    var seconds = C.span(history, d.generated_at, d.history_s);
    document.getElementById("ed-charts-title").textContent = "Last " + (seconds >= 120 ? seconds / 60 + " Minutes" :
      seconds === 60 ? "Minute" : seconds + " Seconds") + ", All Workers";
    return [d.generated_at - seconds, d.generated_at];
  }

  function renderCharts(d) {
    var w = chartWindow(d), t0 = w[0], t1 = w[1], bin = Math.max(2, 2 * spacing());
    var speed = C.binned(history, function (s) { return s.tokens_per_second; }, t0, t1, bin, C.sum);
    C.lineChart(document.getElementById("ed-chart-speed"), {
      title: "Generation speed", t0: t0, t1: t1, format: U.rate, axis: U.axis,
      series: [{label: "Generated (all workers)", color: COLORS[0], points: speed,
                last: d.throughput.engine_tokens_per_second}]
    });
    var series = [
      ["Queued, Not Yet Claimed", function (s) { return s.queued; }, C.max, COLORS[3]],
      ["Waiting in Engines", function (s) { return s.waiting; }, C.sum, COLORS[1]],
      ["Running", function (s) { return s.running; }, C.sum, COLORS[0]]
    ].map(function (spec) {
      var points = C.binned(history, spec[1], t0, t1, bin, spec[2]);
      var lastPoint = points.filter(function (p) { return p[1] !== null; }).pop();
      return {label: spec[0], color: spec[3], points: points, last: lastPoint ? lastPoint[1] : null};
    });
    C.lineChart(document.getElementById("ed-chart-queue"), {
      title: "Queue depth", t0: t0, t1: t1, series: series, format: U.jobs, axis: U.axis
    });
  }

  function memoryChart(box, w, d) {
    var samples = history[w.worker_id] || [], t1 = d.generated_at, t0 = t1 - C.span(history, t1, d.history_s), m = w.memory;
    var pick = function (field) { return samples.map(function (s) { return [s.t, s[field]]; }); };
    var limit = m.limit_bytes || last(samples, "limit_bytes");
    var peak = samples.reduce(function (top, s) { return Math.max(top, s.peak_bytes || 0, s.active_bytes || 0); },
                              Math.max(m.peak_bytes || 0, m.active_bytes || 0));
    var series = [
      {label: "Active", color: COLORS[0], points: pick("active_bytes"), last: m.active_bytes},
      {label: "Peak", color: COLORS[1], points: pick("peak_bytes"), last: m.peak_bytes, dash: true},
      {label: "Allocator Cache", color: COLORS[2], points: pick("cache_bytes"), last: m.cache_bytes}
    ];
    var note = null;
    if (limit && limit <= peak * 4) {
      series.push({label: "Limit", color: COLORS[3], points: pick("limit_bytes"), last: limit, dash: true});
    } else if (limit) {
      note = "Limit " + U.bytes(limit) + " (" + U.percent(peak / limit) + " used at peak; off the scale)";
    }
    C.lineChart(box, {title: "Device memory", t0: t0, t1: t1, series: series, format: U.bytes, bytes: true,
                      ceiling: limit, note: note});
  }

  function cacheTables(w) {
    var wrap = el("div");
    var c = w.cache;
    if (!c) { wrap.appendChild(el("p", "Prefix cache off on this worker.", "ed-quiet")); return wrap; }
    var rows = [["Back End", title(c.backend || "–")], ["Hit Rate", U.percent(c.hit_rate)],
                ["Hits / Misses", U.count(c.hits) + " / " + U.count(c.misses)], ["Entries", U.count(c.entries)],
                ["Size", U.bytes(c.bytes_used) + (c.bytes_limit ? " of " + U.bytes(c.bytes_limit) : "")],
                ["Tokens Served", U.count(c.tokens_served)], ["Stores / Evictions", U.count(c.stores) + " / " + U.count(c.evictions)]];
    if (c.ssd_enabled) rows.push(["On SSD", U.count(c.ssd_entries) + " entries, " + U.bytes(c.ssd_bytes)]);
    wrap.appendChild(kvTable("Prefix Cache", rows));
    var byType = c.hits_by_type || {}, types = Object.keys(byType);
    if (types.length) {
      var order = Object.keys(MATCH_TYPES);
      types.sort(function (a, b) { return (order.indexOf(a) + 1 || 99) - (order.indexOf(b) + 1 || 99) || (a < b ? -1 : 1); });
      var t = kvTable("Lookups by Match Type", types.map(function (k) { return [MATCH_TYPES[k] || title(k), U.count(byType[k])]; }));
      t.classList.add("ed-hits-by-type"); t.style.marginTop = "8px";
      wrap.appendChild(t);
    }
    return wrap;
  }

  function entryRows(w, d) {
    var entries = w.cache_entries || [];
    if (!unfolded[w.worker_id]) entries = entries.slice(0, ENTRIES_FOLDED);
    return entries.map(function (e) {
      var id = w.worker_id + " " + e.key_hash, button = el("button", "Evict", "ed-evict");
      button.type = "button";
      button.setAttribute("data-key", e.key_hash);
      button.setAttribute("aria-label", "Evict prefix-cache entry " + e.key_hash);
      button.addEventListener("click", function () { askEvict(w.worker_id, e); });
      var key = el("span", e.key_hash, "ed-mono");
      var tier = el("span", TIERS[e.tier] || title(e.tier || "–"), "ed-tier " + (e.tier || ""));
      var tr = row([key, tier, U.count(e.tokens), U.bytes(e.bytes), U.count(e.hit_count),
                    U.ago(d.generated_at - e.last_used), e.quantized ? "Yes" : "No", button],
                   [false, false, true, true, true, true, false, false]);
      tr.setAttribute("data-key", e.key_hash);
      if (pending[id]) { tr.className = "ed-pending"; button.disabled = true; button.textContent = "Evicting…"; }
      return tr;
    });
  }

  function renderWorker(w, d) {
    var section = el("section", null, "ed-worker"), h = el("h3", w.worker_id);
    section.setAttribute("data-worker", w.worker_id);
    var device = U.device(w.memory.device || w.device);
    h.appendChild(el("span", "  ·  " + [device, U.count(w.num_running) + " running", U.count(w.num_waiting) + " waiting",
      U.rate(w.tokens_per_second), w.context_length ? "context " + U.count(w.context_length) + " tokens" : null,
      "seen " + U.ago(w.last_seen_s)].filter(Boolean).join("  ·  "), "ed-quiet"));
    section.appendChild(h);
    var cols = el("div", null, "ed-worker-cols"), chart = el("div", null, "ed-chart");
    chart.appendChild(el("div", "Device Memory (" + device + ")", "ed-chart-title"));
    var box = el("div", null, "ed-memory-chart"); chart.appendChild(box);
    var m = w.memory;
    cols.appendChild(chart);
    cols.appendChild(kvTable("Memory", [["Active", U.bytes(m.active_bytes)], ["Peak", U.bytes(m.peak_bytes)],
      ["Allocator Cache", U.bytes(m.cache_bytes)], ["Limit", m.limit_bytes ? U.bytes(m.limit_bytes) : "–"],
      ["Budget", U.bytes(m.budget_bytes)], ["Weights", U.bytes(m.weights_bytes)], ["KV Cache", U.bytes(m.kv_bytes)],
      ["Prefix Cache", U.bytes(m.prefix_cache_bytes)]]));
    cols.appendChild(cacheTables(w));
    section.appendChild(cols);
    var listed = (w.cache_entries || []).length, total = w.cache ? w.cache.entries : listed;
    var shown = unfolded[w.worker_id] ? listed : Math.min(listed, ENTRIES_FOLDED);
    section.appendChild(el("h4", "Prefix-Cache Entries" + (total > shown ? " (the " + shown + " most recently used of " +
      U.count(total) + ")" : "")));
    var table = dataTable(["Key", "Tier", "Tokens", "Size", "Hits", "Last Used", "Quantized", ""], entryRows(w, d),
                          [false, false, true, true, true, true, false, false]);
    table.classList.add("ed-entries");
    section.appendChild(table);
    if (listed > ENTRIES_FOLDED) {
      var more = el("button", unfolded[w.worker_id] ? "Show the " + ENTRIES_FOLDED + " Most Recent" : "Show " + listed + " Entries", "ed-more");
      more.type = "button";
      more.addEventListener("click", function () { unfolded[w.worker_id] = !unfolded[w.worker_id]; renderWorkers(lastData); });
      section.appendChild(more);
    }
    return [section, function () { memoryChart(box, w, d); }];
  }

  function renderWorkers(d) {
    var box = document.getElementById("ed-workers"), draws = [], groups = [], byModel = {};
    d.workers.forEach(function (w) {
      var model = w.model || "";
      if (!(model in byModel)) { byModel[model] = []; groups.push(model); }
      byModel[model].push(w);
    });
    var named = groups.some(function (g) { return g; });
    box.replaceChildren();
    groups.forEach(function (model) {
      if (named) box.appendChild(el("h3", "Model: " + (model || "not reported"), "ed-model"));
      byModel[model].forEach(function (w) {
        var made = renderWorker(w, d); box.appendChild(made[0]); draws.push(made[1]);
      });
    });
    if (!d.workers.length) box.appendChild(el("p", "No engine worker has sent a heartbeat in the last 15 s.", "ed-quiet"));
    draws.forEach(function (draw) { draw(); });  // once in the page, so the charts know their width
  }

  function renderRequests(d) {
    var numeric = [false, false, false, true, true, false, true, true, false];
    var rows = d.requests.map(function (r) {
      var id = el("span", shortId(r.request_id), "ed-mono"); id.title = r.request_id;
      var out = el("span", null, "ed-nowrap"), bar = el("span", null, "ed-bar"), fill = el("span");
      var progress = typeof r.progress === "number" ? Math.min(1, r.progress) : 0;
      fill.style.width = Math.round(progress * 100) + "%"; bar.appendChild(fill);
      out.appendChild(document.createTextNode(U.count(r.completion_tokens) + " / " + U.count(r.max_tokens) + " "));
      out.appendChild(bar); out.appendChild(document.createTextNode(" " + Math.round(progress * 100) + "%"));
      var cache = r.cache_hit_type ? (MATCH_TYPES[r.cache_hit_type] || title(r.cache_hit_type)) +
        (r.cached_tokens ? ", " + U.count(r.cached_tokens) + " tokens" : "") : "–";
      return row([r.worker_id, id, title(r.status) + " · " + title(r.phase || ""), U.seconds(r.elapsed_s),
                  U.count(r.prompt_tokens) + " tokens", out, U.rate(r.tokens_per_second), U.seconds(r.ttft_s), cache], numeric);
    });
    document.getElementById("ed-requests").replaceChildren(dataTable(
      ["Worker", "Request", "Status", "Elapsed", "Prompt", "Output", "Speed", "Time to First Token", "Prefix Cache"], rows, numeric));
  }

  function prunePending(d) {
    var listed = {};
    d.workers.forEach(function (w) { (w.cache_entries || []).forEach(function (e) { listed[w.worker_id + " " + e.key_hash] = true; }); });
    Object.keys(pending).forEach(function (id) { if (!listed[id] || Date.now() - pending[id] > PENDING_MS) delete pending[id]; });
  }

  function render(d) {
    lastData = d;
    mergeHistory(d);
    prunePending(d);
    renderSummary(d);
    renderCharts(d);
    renderWorkers(d);
    renderRequests(d);
    var st = document.getElementById("ed-status");
    st.className = d.redis_error ? "error" : "ed-quiet";
    st.textContent = (d.redis_error ? "Redis unreachable (" + d.redis_error + "). " : "") + "Updated " +
      new Date(d.generated_at * 1000).toLocaleTimeString() + "; refreshes every 2 s.";
    updates += 1;
    document.body.setAttribute("data-ed-updates", String(updates));
  }

  function say(text, isError) {
    var m = document.getElementById("ed-message");
    m.textContent = text; m.className = isError ? "ed-error" : "ed-quiet";
  }

  function refresh() {
    // Samples overlap the last poll's by 30 s (clocks of web and worker hosts may differ a little);
    // mergeHistory keeps each worker's samples once.
    var url = DATA_URL + (lastData ? "?since=" + encodeURIComponent(lastData.generated_at - 30) : "");
    fetch(url, {credentials: "same-origin", headers: {"Accept": "application/json"}})
      .then(function (r) { if (!r.ok) throw new Error("HTTP " + r.status); return r.json(); })
      .then(render)
      .catch(function (e) {
        var st = document.getElementById("ed-status"); st.className = "error"; st.textContent = "Update failed: " + e.message;
      });
  }

  function askEvict(workerId, entry) {
    evictTarget = {worker_id: workerId, key: entry.key_hash};
    document.getElementById("ed-evict-text").textContent = "Worker " + workerId + " drops entry " + entry.key_hash +
      " (" + U.count(entry.tokens) + " tokens, " + U.bytes(entry.bytes) + ", " + (TIERS[entry.tier] || entry.tier) +
      " tier) from every tier. Requests that start with this prefix compute it again.";
    document.getElementById("ed-evict-dialog").showModal();
  }

  function evict(target) {
    var token = document.querySelector("#ed-evict-dialog input[name=csrfmiddlewaretoken]").value;
    fetch(EVICT_URL, {method: "POST", credentials: "same-origin", body: JSON.stringify(target),
                      headers: {"Content-Type": "application/json", "Accept": "application/json", "X-CSRFToken": token}})
      .then(function (r) {
        return r.json().catch(function () { return {}; }).then(function (body) {
          if (r.status !== 202) throw new Error((body.error && body.error.message) || "HTTP " + r.status);
          pending[target.worker_id + " " + target.key] = Date.now();
          say("Eviction of entry " + target.key + " requested from worker " + target.worker_id +
              "; it leaves the list with the worker's next heartbeat.", false);
          if (lastData) renderWorkers(lastData);
        });
      })
      .catch(function (e) { say("Eviction failed: " + e.message, true); });
  }

  document.getElementById("ed-evict-dialog").addEventListener("close", function () {
    var dialog = document.getElementById("ed-evict-dialog"), target = evictTarget;
    evictTarget = null;
    if (dialog.returnValue === "confirm" && target) evict(target);
    dialog.returnValue = "";
  });

  render(JSON.parse(document.getElementById("ed-initial").textContent));
  setInterval(refresh, POLL_MS);
})();
