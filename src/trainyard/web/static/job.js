// Keeps an open job page current without reloading it: polls /jobs/{id}/live?after=EVENT_ID for what
// changed (state, progress, cost, new curve points, new events, the checkpoints that exist) and stops
// when the job has finished.
(function () {
  "use strict";
  var cfgEl = document.getElementById("job-live");
  if (!cfgEl) return;
  var cfg = JSON.parse(cfgEl.textContent);
  var after = cfg.after;
  var sinceStep = cfg.since_step || 0;
  var status = document.getElementById("live-status");
  var stopped = cfg.terminal;
  var failures = 0;

  function text(id, value) {
    var el = document.getElementById(id);
    if (el && value !== undefined && value !== null) el.textContent = String(value);
  }

  function mergeSeries(spec, label, pts) {
    var s = spec.series.filter(function (x) { return x.label === label; })[0];
    if (!s) {
      // the first points of a chart replace its empty placeholder series
      if (spec.series.length === 1 && !spec.series[0].points.length) { s = spec.series[0]; s.label = label; }
      else { s = { label: label, color: null, points: [] }; spec.series.push(s); }
    }
    var seen = {};
    s.points.forEach(function (p, i) { seen[p[0]] = i; });
    pts.forEach(function (p) {
      if (seen[p[0]] !== undefined) s.points[seen[p[0]]] = p; else s.points.push(p);
    });
    s.points.sort(function (a, b) { return a[0] - b[0]; });
  }

  var palette = ["#2563eb", "#dc2626", "#16a34a", "#9333ea", "#ea580c", "#0891b2"];

  function updateCharts(doc) {
    var C = window.trainyardCharts;
    if (!C) return;
    var loss = C.spec("loss-chart");
    var attempts = Object.keys(doc.loss);
    if (loss && attempts.length) {
      attempts.forEach(function (a) { mergeSeries(loss, "attempt " + a, doc.loss[a]); });
      if (doc.eval_loss && doc.eval_loss.length) mergeSeries(loss, "eval loss", doc.eval_loss);
      loss.series.forEach(function (s, i) { if (!s.color) s.color = palette[i % palette.length]; });
      C.update("loss-chart", loss);
    }
    var st = C.spec("step-time-chart");
    if (st && doc.step_times.length) {
      mergeSeries(st, "measured", doc.step_times);
      if (!st.series[0].color) st.series[0].color = palette[0];
      C.update("step-time-chart", st);
    }
  }

  function cell(tag, content, cls) {
    var el = document.createElement(tag);
    if (cls) el.className = cls;
    if (content !== undefined) el.textContent = content;
    return el;
  }

  function addEvents(events) {
    var body = document.getElementById("events-body");
    if (!body || !events.length) return;
    var none = document.getElementById("no-events");
    if (none) none.remove();
    for (var i = events.length - 1; i >= 0; i--) {
      var e = events[i];
      var tr = document.createElement("tr");
      tr.className = "ev-" + e.kind + " new";
      tr.appendChild(cell("td", e.time || "", "muted nowrap"));
      var k = cell("td"); k.appendChild(cell("span", e.kind, "kind")); tr.appendChild(k);
      var d = cell("td", undefined, "wrap");
      d.appendChild(cell("span", e.summary, "summary"));
      if (e.fields.length) {
        var f = cell("div", undefined, "fields");
        e.fields.forEach(function (kv) {
          var item = cell("span", kv[0] + ": ", "kv-item");
          item.appendChild(cell("code", kv[1]));
          f.appendChild(item);
        });
        d.appendChild(f);
      }
      if (e.text) {
        var det = document.createElement("details");
        det.appendChild(cell("summary", "details"));
        det.appendChild(cell("pre", e.text, "text"));
        d.appendChild(det);
      }
      tr.appendChild(d);
      body.insertBefore(tr, body.firstChild);
    }
  }

  function updateCheckpoints(list) {
    var box = document.getElementById("checkpoints");
    if (!box) return;
    box.textContent = "";
    if (!list.length) { box.appendChild(cell("p", "No checkpoint exists.", "empty")); return; }
    var t = document.createElement("table");
    var head = document.createElement("thead");
    var hr = document.createElement("tr");
    hr.appendChild(cell("th", "Step", "r")); hr.appendChild(cell("th", "Attempt", "r")); hr.appendChild(cell("th", "Path"));
    head.appendChild(hr); t.appendChild(head);
    var b = document.createElement("tbody");
    list.forEach(function (c) {
      var tr = document.createElement("tr");
      tr.appendChild(cell("td", String(c.step), "r"));
      tr.appendChild(cell("td", c.attempt === null || c.attempt === undefined ? "–" : String(c.attempt), "r"));
      tr.appendChild(cell("td", c.path, "path"));
      b.appendChild(tr);
    });
    t.appendChild(b);
    box.appendChild(t);
  }

  function apply(doc) {
    var badge = document.getElementById("job-state");
    if (badge) { badge.textContent = doc.state; badge.className = "badge state-" + doc.state; }
    text("job-reason", doc.reason);
    text("job-cost", doc.cost_text);
    text("job-attempt", doc.attempt);
    text("job-steps", (doc.step === null ? 0 : doc.step) + (doc.total_steps ? "/" + doc.total_steps : ""));
    var prog = document.getElementById("job-progress");
    if (prog && doc.progress !== null) prog.value = doc.progress;
    updateCharts(doc);
    addEvents(doc.events);
    updateCheckpoints(doc.checkpoints);
    after = doc.next_after;
    sinceStep = doc.next_since_step;
    if (doc.terminal) {
      stopped = true;
      if (status) status.textContent = "This job has finished (" + doc.state + ").";
      var actions = document.querySelector(".actions");
      if (actions) actions.remove();
    } else if (status) {
      status.textContent = "Updated " + new Date().toLocaleTimeString() + "; updates every " + cfg.poll_s + " s without reloading.";
    }
  }

  function poll() {
    if (stopped) return;
    fetch(cfg.url + "?after=" + encodeURIComponent(after) + "&since_step=" + encodeURIComponent(sinceStep), { credentials: "same-origin", headers: { Accept: "application/json" } })
      .then(function (r) {
        if (r.status === 401) { stopped = true; if (status) status.textContent = "Logged out; reload to log in again."; return null; }
        if (!r.ok) throw new Error("HTTP " + r.status);
        return r.json();
      })
      .then(function (doc) {
        failures = 0;
        if (doc) apply(doc);
        if (!stopped) setTimeout(poll, doc && doc.more ? 50 : cfg.poll_s * 1000);
      })
      .catch(function () {
        failures += 1;
        if (status) status.textContent = "Could not reach the server; retrying…";
        setTimeout(poll, Math.min(30000, cfg.poll_s * 1000 * Math.pow(2, failures)));
      });
  }

  if (!stopped) setTimeout(poll, cfg.poll_s * 1000);
})();
