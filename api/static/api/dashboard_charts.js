/* The engine dashboard's units and charts: human-readable figures, and line charts drawn as small
   inline SVG (no library: the service is self-hosted and may run offline). */
(function () {
  "use strict";
  var SVG = "http://www.w3.org/2000/svg";

  function missing(v) { return v === null || v === undefined || (typeof v === "number" && !isFinite(v)); }

  var units = {
    bytes: function (n) {
      if (missing(n)) return "–";
      var u = ["B", "KiB", "MiB", "GiB", "TiB"], i = 0;
      while (Math.abs(n) >= 1024 && i < u.length - 1) { n /= 1024; i++; }
      return (i === 0 ? String(Math.round(n)) : n.toFixed(n < 10 ? 2 : 1)) + " " + u[i];
    },
    count: function (n) { return missing(n) ? "–" : Math.round(n).toLocaleString("en-US"); },
    // An axis value: up to 2 decimals when the axis is that fine, thousands separated.
    axis: function (n) { return missing(n) ? "–" : Number(n.toFixed(n < 10 ? 2 : 0)).toLocaleString("en-US"); },
    jobs: function (n) { return missing(n) ? "–" : Math.round(n).toLocaleString("en-US") + (Math.round(n) === 1 ? " job" : " jobs"); },
    rate: function (n) {
      if (missing(n)) return "–";
      return (n >= 100 || n === 0 ? Math.round(n).toLocaleString("en-US") : n.toFixed(1)) + " tokens/s";
    },
    percent: function (f) { return missing(f) ? "–" : (f * 100).toFixed(f > 0 && f < 0.1 ? 1 : 0) + "%"; },
    seconds: function (s) {
      if (missing(s)) return "–";
      if (s < 1) return Math.round(s * 1000) + " ms";
      if (s < 60) return s.toFixed(s < 10 ? 1 : 0) + " s";
      if (s < 3600) return Math.floor(s / 60) + " min " + Math.round(s % 60) + " s";
      return Math.floor(s / 3600) + " h " + Math.round((s % 3600) / 60) + " min";
    },
    ago: function (s) {
      if (missing(s)) return "–";
      s = Math.max(0, s);
      if (s < 60) return Math.round(s) + " s ago";
      if (s < 3600) return Math.round(s / 60) + " min ago";
      if (s < 86400) return Math.round(s / 3600) + " h ago";
      return Math.round(s / 86400) + " d ago";
    },
    device: function (d) {
      var names = {metal: "Metal", cuda: "CUDA", cpu: "CPU", gpu: "GPU"};
      return names[d] || (d ? String(d).toUpperCase() : "Unknown device");
    }
  };

  function node(tag, attrs, parent) {
    var e = document.createElementNS(SVG, tag);
    Object.keys(attrs || {}).forEach(function (k) { e.setAttribute(k, attrs[k]); });
    if (parent) parent.appendChild(e);
    return e;
  }

  // 1, 2 or 5 times a power of ten, at least v: an axis top that reads well.
  function niceCeil(v) {
    if (!(v > 0)) return 1;
    var p = Math.pow(10, Math.floor(Math.log10(v))), m = v / p;
    return (m <= 1 ? 1 : m <= 2 ? 2 : m <= 5 ? 5 : 10) * p;
  }
  // For bytes: a power of two of KiB/MiB/GiB times 1, 2, 4 or 8, at least v.
  function niceBytes(v) {
    if (!(v > 0)) return 1024;
    return Math.pow(2, Math.ceil(Math.log2(v)));
  }

  /* Draw a line chart into `box` (a div): opts.series = [{label, color, points: [[t, v], ...],
     dash, last}], opts.t0/t1 (unix seconds), opts.format (legend values), opts.axis (axis values;
     opts.format without it), opts.bytes (nicer axis tops for byte figures), opts.ceiling (a value
     the axis may stretch to, if close), opts.note (a line under the chart). */
  function lineChart(box, opts) {
    box.replaceChildren();
    var width = Math.max(260, Math.round(box.clientWidth || 360)), height = 170;
    var left = 64, right = 8, top = 8, bottom = 20;
    var svg = node("svg", {viewBox: "0 0 " + width + " " + height, role: "img", "aria-label": opts.title || "chart"}, box);
    var max = 0, any = false;
    opts.series.forEach(function (s) {
      s.points.forEach(function (p) { if (!missing(p[1])) { any = true; max = Math.max(max, p[1]); } });
    });
    if (!missing(opts.ceiling) && opts.ceiling > 0 && opts.ceiling <= max * 4) max = Math.max(max, opts.ceiling);
    var yMax = opts.bytes ? niceBytes(max * 1.05) : niceCeil(max * 1.05);
    var x = function (t) { return left + (t - opts.t0) / (opts.t1 - opts.t0) * (width - left - right); };
    var y = function (v) { return top + (1 - v / yMax) * (height - top - bottom); };
    [0, 0.5, 1].forEach(function (f) {
      var v = yMax * f, yy = y(v);
      node("line", {x1: left, x2: width - right, y1: yy, y2: yy, "class": "ed-grid"}, svg);
      node("text", {x: left - 6, y: yy + 4, "text-anchor": "end"}, svg).textContent = (opts.axis || opts.format)(v);
    });
    var span = opts.t1 - opts.t0, ago = function (sec) {
      return "−" + (span >= 120 ? Math.round(sec / 60) + " min" : Math.round(sec) + " s");
    };
    [[opts.t0, ago(span), "start"], [opts.t0 + span / 2, ago(span / 2), "middle"], [opts.t1, "now", "end"]].forEach(function (tick) {
      node("text", {x: x(tick[0]), y: height - 4, "text-anchor": tick[2]}, svg).textContent = tick[1];
    });
    opts.series.forEach(function (s) {
      var d = "", pen = false, end = null;
      s.points.forEach(function (p) {
        if (missing(p[1]) || p[0] < opts.t0) { pen = false; return; }
        end = [x(p[0]), y(Math.min(p[1], yMax))];
        d += (pen ? "L" : "M") + end[0].toFixed(1) + " " + end[1].toFixed(1);
        pen = true;
      });
      if (d) {
        var path = node("path", {d: d, stroke: s.color, "class": "ed-series"}, svg);
        if (s.dash) path.setAttribute("stroke-dasharray", "5 4");
        path.setAttribute("data-series", s.label);
        // The latest value as a dot: visible even while a series has a single point.
        node("circle", {cx: end[0].toFixed(1), cy: end[1].toFixed(1), r: 2.5, fill: s.color}, svg);
      }
    });
    if (!any) node("text", {x: (left + width) / 2, y: height / 2, "text-anchor": "middle"}, svg).textContent = "No samples yet";
    var legend = document.createElement("div");
    legend.className = "ed-legend";
    opts.series.forEach(function (s) {
      var item = document.createElement("span"), sw = document.createElement("span");
      sw.className = "ed-swatch"; sw.style.background = s.color;
      item.appendChild(sw);
      item.appendChild(document.createTextNode(s.label + ": " + opts.format(s.last)));
      legend.appendChild(item);
    });
    box.appendChild(legend);
    if (opts.note) {
      var note = document.createElement("div");
      note.className = "ed-quiet"; note.style.fontSize = "12px"; note.textContent = opts.note;
      box.appendChild(note);
    }
  }

  /* Per-worker samples folded onto one time axis: for each bin of `binS` seconds, `value(sample)`
     averaged per worker within the bin, then combined across workers with `combine` (sum, max). */
  function binned(history, value, t0, t1, binS, combine) {
    var bins = Math.max(1, Math.ceil((t1 - t0) / binS)), out = [];
    var perWorker = Object.keys(history).map(function (id) {
      var sums = new Array(bins).fill(0), counts = new Array(bins).fill(0);
      history[id].forEach(function (s) {
        var v = value(s), i = Math.floor((s.t - t0) / binS);
        if (missing(v) || i < 0 || i >= bins) return;
        sums[i] += v; counts[i] += 1;
      });
      return sums.map(function (v, i) { return counts[i] ? v / counts[i] : null; });
    });
    for (var i = 0; i < bins; i++) {
      var vals = perWorker.map(function (w) { return w[i]; }).filter(function (v) { return v !== null; });
      out.push([t0 + (i + 1) * binS, vals.length ? combine(vals) : null]);
    }
    return out;
  }

  /* The charts' time window: the shortest of 1, 2, 5 and `maxS` seconds' worth that holds every
     sample, so a worker that started a minute ago fills its charts instead of their last sliver. */
  function span(history, now, maxS) {
    var earliest = now;
    Object.keys(history).forEach(function (id) { if (history[id].length) earliest = Math.min(earliest, history[id][0].t); });
    var spans = [60, 120, 300].filter(function (s) { return s < maxS; }).concat([maxS]);
    for (var i = 0; i < spans.length; i++) if (now - earliest <= spans[i]) return spans[i];
    return maxS;
  }

  function sum(vals) { return vals.reduce(function (a, b) { return a + b; }, 0); }
  function maxOf(vals) { return Math.max.apply(null, vals); }

  window.EngineDashboardCharts = {units: units, lineChart: lineChart, binned: binned, span: span, sum: sum, max: maxOf};
})();
