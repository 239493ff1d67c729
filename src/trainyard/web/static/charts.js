// Draws the dashboard's charts with uPlot (vendored in /static/vendor/uplot) from the JSON specs the
// server puts next to each chart (trainyard.web.charts): line charts with reference lines, bars, and
// estimates with 95 % intervals. window.trainyardCharts.update(id, spec) redraws one with new data.
(function () {
  "use strict";
  var charts = {};

  function fmt(v) {
    if (v === null || v === undefined || !isFinite(v)) return "–";
    var a = Math.abs(v);
    if (a === 0) return "0";
    if (a >= 1e5 || a < 1e-3) return v.toExponential(2);
    return String(Number(v.toPrecision(4)));
  }

  // dollars as trainyard.cost.money.format_usd writes them: $1,234 / $12.40 / $0.00056
  function usd(v) {
    if (v === null || v === undefined || !isFinite(v)) return "–";
    var sign = v < 0 ? "-" : "", a = Math.abs(v);
    if (a >= 1000) return sign + "$" + Math.round(a).toLocaleString("en-US");
    if (a >= 1 || a === 0) return sign + "$" + a.toFixed(2);
    var decimals = Math.max(2, 2 - 1 - Math.floor(Math.log10(a)));
    return sign + "$" + a.toFixed(decimals);
  }

  function valueText(v, unit) {
    if (unit === "USD") return usd(v);
    return fmt(v) + (unit ? " " + unit : "");
  }

  function emptyNote(el, text) {
    var p = document.createElement("p");
    p.className = "no-data";
    p.textContent = text || "no data yet";
    el.appendChild(p);
  }

  function width(el) {
    return Math.max(240, Math.floor(el.clientWidth || (el.parentNode && el.parentNode.clientWidth) || 600));
  }

  function lineData(spec) {
    // align every series on the union of their x values (uPlot wants one x array)
    var xs = {};
    spec.series.forEach(function (s) { s.points.forEach(function (p) { xs[p[0]] = true; }); });
    var x = Object.keys(xs).map(Number).sort(function (a, b) { return a - b; });
    var index = {};
    x.forEach(function (v, i) { index[v] = i; });
    var data = [x];
    spec.series.forEach(function (s) {
      var ys = new Array(x.length).fill(null);
      s.points.forEach(function (p) { ys[index[p[0]]] = p[1]; });
      data.push(ys);
    });
    (spec.hlines || []).forEach(function (h) { data.push(x.map(function () { return h.y; })); });
    return data;
  }

  function lineOpts(spec, el) {
    var series = [{ label: spec.x_label, value: function (u, v) { return fmt(v); } }];
    spec.series.forEach(function (s) {
      series.push({ label: s.label, stroke: s.color, width: 2, spanGaps: true,
        points: { show: s.points.length <= 400, size: 5 }, value: function (u, v) { return fmt(v); } });
    });
    (spec.hlines || []).forEach(function (h) {
      series.push({ label: h.label + " " + fmt(h.y), stroke: h.color, width: 1.5, dash: [6, 4],
        points: { show: false }, value: function () { return fmt(h.y); } });
    });
    return {
      title: spec.title, width: width(el), height: Number(el.dataset.height || 260),
      scales: { x: { time: false } },
      axes: [{ label: spec.x_label, values: function (u, vs) { return vs.map(fmt); } },
             { label: spec.y_label, size: 70, values: function (u, vs) { return vs.map(function (v) { return spec.y_unit === "USD" ? usd(v) : fmt(v); }); } }],
      series: series,
    };
  }

  function barsChart(spec, el) {
    var labels = spec.bars.map(function (b) { return b.label; });
    var x = labels.map(function (_, i) { return i; });
    var y = spec.bars.map(function (b) { return b.value; });
    var colors = spec.bars.map(function (b) { return b.color; });
    var opts = {
      title: spec.title, width: width(el), height: Number(el.dataset.height || 220),
      legend: { show: false },
      scales: { x: { time: false, range: [-0.5, labels.length - 0.5] }, y: { range: function (u, lo, hi) { return [0, hi > 0 ? hi * 1.1 : 1]; } } },
      axes: [{ splits: function () { return x; }, values: function (u, vs) { return vs.map(function (v) { return labels[v] || ""; }); }, gap: 6 },
             { label: spec.unit, size: 70, values: function (u, vs) { return vs.map(function (v) { return spec.unit === "USD" ? usd(v) : fmt(v); }); } }],
      series: [{}, { label: spec.unit, stroke: "transparent", points: { show: false } }],
      hooks: { draw: [function (u) {
        var ctx = u.ctx;
        ctx.save();
        ctx.font = (12 * devicePixelRatio) + "px system-ui, sans-serif";
        ctx.textAlign = "center";
        ctx.fillStyle = "#111827";
        y.forEach(function (v, i) {
          var cx = u.valToPos(i, "x", true), cy = u.valToPos(v, "y", true);
          var bw = Math.min(80 * devicePixelRatio, u.bbox.width / labels.length * 0.6);
          ctx.fillStyle = colors[i] || "#2563eb";
          ctx.fillRect(cx - bw / 2, cy, bw, u.valToPos(0, "y", true) - cy);
          ctx.fillStyle = "#111827";
          ctx.fillText(valueText(v, spec.unit), cx, cy - 4 * devicePixelRatio);
        });
        ctx.restore();
      }] },
    };
    return { opts: opts, data: [x, y] };
  }

  function intervalsChart(spec, el) {
    var rows = spec.rows;
    var x = rows.map(function (_, i) { return i; });
    var lo = rows.map(function (r) { return r.low !== undefined ? r.low : r.value; });
    var hi = rows.map(function (r) { return r.high !== undefined ? r.high : r.value; });
    var v = rows.map(function (r) { return r.value; });
    var all = lo.concat(hi).concat([0]);
    var min = Math.min.apply(null, all), max = Math.max.apply(null, all);
    var pad = (max - min) * 0.15 || 1;
    var opts = {
      title: spec.title, width: width(el), height: Number(el.dataset.height || 220),
      legend: { show: false },
      scales: { x: { time: false, range: [-0.5, rows.length - 0.5] }, y: { range: [min - pad, max + pad] } },
      axes: [{ splits: function () { return x; }, values: function (u, vs) { return vs.map(function (i) { return rows[i] ? rows[i].label : ""; }); } },
             { label: spec.unit, size: 70, values: function (u, vs) { return vs.map(fmt); } }],
      series: [{}, { label: "delta", stroke: "transparent", points: { show: false } }],
      hooks: { draw: [function (u) {
        var ctx = u.ctx, d = devicePixelRatio;
        ctx.save();
        var y0 = u.valToPos(0, "y", true);
        ctx.strokeStyle = "#6b7280"; ctx.setLineDash([4 * d, 4 * d]); ctx.lineWidth = d;
        ctx.beginPath(); ctx.moveTo(u.bbox.left, y0); ctx.lineTo(u.bbox.left + u.bbox.width, y0); ctx.stroke();
        ctx.setLineDash([]);
        ctx.font = (12 * d) + "px system-ui, sans-serif"; ctx.textAlign = "left";
        rows.forEach(function (r, i) {
          var cx = u.valToPos(i, "x", true);
          var yl = u.valToPos(lo[i], "y", true), yh = u.valToPos(hi[i], "y", true), yv = u.valToPos(v[i], "y", true);
          ctx.strokeStyle = r.color; ctx.fillStyle = r.color; ctx.lineWidth = 2 * d;
          ctx.beginPath(); ctx.moveTo(cx, yl); ctx.lineTo(cx, yh);
          ctx.moveTo(cx - 8 * d, yl); ctx.lineTo(cx + 8 * d, yl);
          ctx.moveTo(cx - 8 * d, yh); ctx.lineTo(cx + 8 * d, yh); ctx.stroke();
          ctx.beginPath(); ctx.arc(cx, yv, 5 * d, 0, 2 * Math.PI); ctx.fill();
          ctx.fillText(fmt(v[i]) + spec.unit + " [" + fmt(lo[i]) + ", " + fmt(hi[i]) + "] " + r.outcome, cx + 12 * d, yv + 4 * d);
        });
        ctx.restore();
      }] },
    };
    return { opts: opts, data: [x, v] };
  }

  function sameShape(a, b) {
    return a && b && a.kind === "line" && b.kind === "line" && a.series.length === b.series.length &&
      (a.hlines || []).length === (b.hlines || []).length;
  }

  function draw(el, spec) {
    var old = charts[spec.id];
    if (old && sameShape(old._spec, spec) && spec.series.some(function (s) { return s.points.length; })) {
      old._spec = spec;
      el.dataset.points = String(spec.series.reduce(function (acc, s) { return acc + s.points.length; }, 0));
      old.setData(lineData(spec));
      return;
    }
    if (old) { old.destroy(); delete charts[spec.id]; }
    el.textContent = "";
    el.dataset.points = "0";
    var built;
    if (spec.kind === "line") {
      var n = spec.series.reduce(function (acc, s) { return acc + s.points.length; }, 0);
      el.dataset.points = String(n);
      if (!n) { emptyNote(el); return; }
      built = { opts: lineOpts(spec, el), data: lineData(spec) };
    } else if (spec.kind === "bars") {
      el.dataset.points = String(spec.bars.length);
      if (!spec.bars.length) { emptyNote(el); return; }
      built = barsChart(spec, el);
    } else if (spec.kind === "intervals") {
      el.dataset.points = String(spec.rows.length);
      if (!spec.rows.length) { emptyNote(el, "no metrics yet"); return; }
      built = intervalsChart(spec, el);
    } else {
      return;
    }
    charts[spec.id] = new uPlot(built.opts, built.data, el);
    charts[spec.id]._spec = spec;
  }

  function init() {
    var els = document.querySelectorAll("[data-chart]");
    Array.prototype.forEach.call(els, function (el) {
      var src = document.getElementById(el.dataset.chart);
      if (!src) return;
      var spec = JSON.parse(src.textContent);
      el._spec = spec;
      draw(el, spec);
    });
    var timer = null;
    window.addEventListener("resize", function () {
      clearTimeout(timer);
      timer = setTimeout(function () {
        Object.keys(charts).forEach(function (id) {
          var el = document.getElementById(id);
          if (el) charts[id].setSize({ width: width(el), height: charts[id].height });
        });
      }, 150);
    });
  }

  window.trainyardCharts = {
    spec: function (id) { var el = document.getElementById(id); return el ? el._spec : null; },
    update: function (id, spec) {
      var el = document.getElementById(id);
      if (!el) return;
      el._spec = spec;
      draw(el, spec);
    },
  };

  if (document.readyState === "loading") document.addEventListener("DOMContentLoaded", init);
  else init();
})();
