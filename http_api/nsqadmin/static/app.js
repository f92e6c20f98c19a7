/* nsqadmin's single-page UI: every page of NSQ's nsqadmin, from nsqadmin's own JSON API, in plain JS.
 *
 * The server returns this page for every page path; route() reads the path under the base path and renders
 * one of PAGES. Links carry data-nav and move with history.pushState. Pages that show live numbers (topic,
 * channel, counter) poll their API route every SAMPLE_MS and feed the charts (chart.js) from successive
 * samples: rates are differences of counters over the time between samples. The health strip on top polls
 * /api/health. Every API reply's "message" (partial-failure warnings) is shown above the page.
 */
(function () {
  "use strict";
  var S = JSON.parse(document.getElementById("settings").textContent);
  var BASE = S.base_path === "/" ? "" : S.base_path;
  var SAMPLE_MS = 2000;
  var HEALTH_MS = 2000;
  var timers = [];
  var pageEl = document.getElementById("page");

  function esc(s) {
    return String(s === null || s === undefined ? "" : s).replace(/[&<>"']/g, function (c) {
      return {"&": "&amp;", "<": "&lt;", ">": "&gt;", "\"": "&quot;", "'": "&#39;"}[c];
    });
  }
  function url(p) { return BASE + "/" + p.replace(/^\//, ""); }
  function enc(s) { return encodeURIComponent(s); }
  function num(v) { return Number(v || 0).toLocaleString("en-US"); }

  function api(method, path, body) {
    var opts = {method: method, headers: {"Accept": "application/json"}};
    if (body !== undefined) {
      opts.body = JSON.stringify(body);
      opts.headers["Content-Type"] = "application/json";
    }
    return fetch(url(path), opts).then(function (r) {
      return r.text().then(function (t) {
        var doc = {};
        try { doc = t ? JSON.parse(t) : {}; } catch (e) { doc = {message: t}; }
        if (!r.ok) {
          var err = new Error(doc.message || ("HTTP " + r.status));
          err.status = r.status;
          throw err;
        }
        return doc;
      });
    });
  }

  function showWarning(msg) {
    var w = document.getElementById("warning");
    w.hidden = !msg;
    w.textContent = msg || "";
  }
  function showError(err) {
    var e = document.getElementById("error");
    e.hidden = !err;
    e.textContent = err ? (err.status ? err.status + " " : "") + err.message : "";
  }

  function every(ms, fn) {
    fn();
    timers.push(setInterval(fn, ms));
  }
  function stopTimers() {
    timers.forEach(clearInterval);
    timers = [];
  }

  function navigate(path) {
    history.pushState({}, "", url(path));
    route();
  }

  document.addEventListener("click", function (ev) {
    var a = ev.target.closest("a[data-nav]");
    if (!a || ev.ctrlKey || ev.metaKey || ev.shiftKey) { return; }
    ev.preventDefault();
    navigate(a.getAttribute("href"));
  });
  window.addEventListener("popstate", route);

  // ---- actions -------------------------------------------------------------------------------------------

  function act(promise, after) {
    promise.then(function (doc) {
      showError(null);
      showWarning(doc.message);
      if (after) { after(); }
    }, showError);
  }

  function confirmThen(text, fn) {
    if (window.confirm(text)) { fn(); }
  }

  function actionButtons(container, path, what, paused, onDeleted, reload) {
    if (!S.is_admin) { return; }
    var box = document.createElement("div");
    box.className = "actions";
    function button(label, id, cls, fn) {
      var b = document.createElement("button");
      b.textContent = label;
      b.id = id;
      if (cls) { b.className = cls; }
      b.addEventListener("click", fn);
      box.appendChild(b);
    }
    button(paused ? "UnPause " + what : "Pause " + what, "action-pause", "", function () {
      var action = paused ? "unpause" : "pause";
      confirmThen("Are you sure you want to " + action + " this " + what.toLowerCase() + "?", function () {
        act(api("POST", path, {action: action}), reload);
      });
    });
    button("Empty " + (what === "Topic" ? "Queue" : what), "action-empty", "danger", function () {
      confirmThen("Are you sure you want to empty this " + what.toLowerCase() + "?", function () {
        act(api("POST", path, {action: "empty"}), reload);
      });
    });
    button("Delete " + what, "action-delete", "danger", function () {
      confirmThen("Are you sure you want to delete this " + what.toLowerCase() + "?", function () {
        act(api("DELETE", path), onDeleted);
      });
    });
    container.appendChild(box);
  }

  // ---- charts from successive samples --------------------------------------------------------------------

  function Sampler(chartsEl, specs) {
    // specs: [{key, title, unit, rate: bool, get: function(doc) -> number}]
    this.specs = specs;
    this.prev = null;
    this.charts = specs.map(function (s) { return new window.LiveChart(chartsEl, s.title, s.unit, s.key); });
  }
  Sampler.prototype.add = function (doc) {
    var now = Date.now() / 1000;
    var prev = this.prev;
    var self = this;
    this.specs.forEach(function (s, i) {
      var v = s.get(doc);
      if (s.rate) {
        if (!prev) { return; }
        var dt = now - prev.t;
        var before = s.get(prev.doc);
        var d = v - before;
        self.charts[i].push(now, d < 0 || dt <= 0 ? null : d / dt);
      } else {
        self.charts[i].push(now, v);
      }
    });
    this.prev = {t: now, doc: doc};
  };

  function p99(e2e) {
    var ps = (e2e && e2e.percentiles) || [];
    var best = null;
    ps.forEach(function (p) { if (best === null || p.quantile > best.quantile) { best = p; } });
    return best ? best.max / 1e6 : null;  // ns -> ms
  }

  function e2eCells(e2e) {
    var ps = (e2e && e2e.percentiles) || [];
    if (!ps.length) { return "<span class='muted'>-</span>"; }
    return ps.map(function (p) {
      return "p" + esc(Math.round(p.quantile * 1000) / 10) + ": " + esc(fmtDuration(p.max));
    }).join(", ");
  }

  function fmtDuration(ns) {
    ns = Number(ns || 0);
    if (ns >= 3600e9) { return (ns / 3600e9).toFixed(1) + "h"; }
    if (ns >= 60e9) { return (ns / 60e9).toFixed(1) + "m"; }
    if (ns >= 1e9) { return (ns / 1e9).toFixed(1) + "s"; }
    if (ns >= 1e6) { return (ns / 1e6).toFixed(1) + "ms"; }
    if (ns >= 1e3) { return (ns / 1e3).toFixed(1) + "us"; }
    return ns + "ns";
  }

  // ---- pages ---------------------------------------------------------------------------------------------

  function topicsPage() {
    var graph = S.graph_enabled;
    api("GET", "api/topics").then(function (doc) {
      showWarning(doc.message);
      var rows = (doc.topics || []).map(function (t) {
        return "<tr data-topic='" + esc(t) + "'><td class='name'><a data-nav href='topics/" + esc(enc(t)) + "'>" +
          esc(t) + "</a></td>" + (graph ? "<td class='rate' data-rate='" + esc(t) + "'>...</td>" : "") + "</tr>";
      }).join("");
      pageEl.innerHTML = "<h2>Topics</h2>" + (rows ? "<table id='topics'><tr><th class='name'>Topic</th>" +
        (graph ? "<th>Rate</th>" : "") + "</tr>" + rows + "</table>" : "<p class='muted' id='topics'>no topics</p>");
      if (graph) {
        (doc.topics || []).forEach(function (t) {
          var fmt = S.statsd_counter_format || "%s";
          var prefix = S.statsd_prefix.replace(/%s/g, "*");
          if (prefix.slice(-1) !== ".") { prefix += "."; }
          var target = "sumSeries(" + fmt.replace(/%s/g, prefix + "topic." + t + ".message_count") + ")";
          api("GET", "api/graphite?metric=rate&target=" + enc(target)).then(function (r) {
            var cell = pageEl.querySelector("td[data-rate='" + t.replace(/'/g, "") + "']");
            if (cell) { cell.textContent = r.rate; }
          }, function () {});
        });
      }
    }, showError);
  }

  var TOPIC_COLS = [["depth", "Depth"], ["memory_depth", "Memory + Disk"], ["message_count", "Messages"]];
  var CHANNEL_COLS = [["depth", "Depth"], ["memory_depth", "Memory + Disk"], ["in_flight_count", "In-Flight"],
    ["deferred_count", "Deferred"], ["requeue_count", "Requeued"], ["timeout_count", "Timed Out"],
    ["message_count", "Messages"], ["client_count", "Connections"]];

  function memDisk(row) { return num(row.memory_depth) + " + " + num(row.backend_depth); }

  function cells(row, cols) {
    return cols.map(function (c) {
      var v = c[0] === "memory_depth" ? memDisk(row) : num(row[c[0]]);
      return "<td data-field='" + c[0] + "'>" + v + "</td>";
    }).join("");
  }

  function topicPage(topic) {
    pageEl.innerHTML = "<h2>Topic <span id='topic-name'>" + esc(topic) + "</span> <span id='topic-state'></span></h2>" +
      "<div id='topic-actions'></div><div class='charts' id='charts'></div><div id='topic-body'></div>";
    var sampler = new Sampler(document.getElementById("charts"), [
      {key: "publish_rate", title: "publish rate", unit: "msg/s", rate: true, get: function (d) { return d.message_count; }},
      {key: "depth", title: "depth", unit: "", get: function (d) { return d.depth; }},
      {key: "e2e_p99", title: "e2e latency, top percentile", unit: "ms", get: function (d) { return p99(d.e2e_processing_latency); }}
    ]);
    var shownPaused = null;
    function reload() {
      api("GET", "api/topics/" + enc(topic)).then(function (doc) {
        showError(null);
        showWarning(doc.message);
        sampler.add(doc);
        if (shownPaused !== doc.paused) {
          shownPaused = doc.paused;
          var actions = document.getElementById("topic-actions");
          actions.innerHTML = "";
          actionButtons(actions, "api/topics/" + enc(topic), "Topic", doc.paused,
            function () { navigate("topics"); }, reload);
        }
        document.getElementById("topic-state").innerHTML = doc.paused ? "<span class='badge paused'>paused</span>" : "";
        var tomb = S.is_admin && S.nsqlookupd && S.nsqlookupd.length;
        var nodes = (doc.nodes || []).map(function (n) {
          return "<tr data-node='" + esc(n.node) + "'><td class='name'>" +
            (tomb ? "<button class='tomb' title='tombstone this node for the topic' data-tombstone='" + esc(n.node) + "'>&#x2718;</button>" : "") +
            "<a data-nav href='nodes/" + esc(enc(n.node)) + "'>" + esc(n.hostname) + " <span class='muted'>" + esc(n.node) + "</span></a>" +
            (n.paused ? "<span class='badge paused'>paused</span>" : "") + "</td>" + cells(n, TOPIC_COLS) +
            "<td>" + num((n.channels || []).length) + "</td><td>" + e2eCells(n.e2e_processing_latency) + "</td></tr>";
        }).join("");
        var chans = (doc.channels || []).map(function (c) {
          return "<tr data-channel='" + esc(c.channel_name) + "'><td class='name'><a data-nav href='topics/" + esc(enc(topic)) + "/" +
            esc(enc(c.channel_name)) + "'>" + esc(c.channel_name) + "</a>" + (c.paused ? "<span class='badge paused'>paused</span>" : "") +
            "</td>" + cells(c, CHANNEL_COLS) + "<td>" + e2eCells(c.e2e_processing_latency) + "</td></tr>";
        }).join("");
        document.getElementById("topic-body").innerHTML =
          "<h3>Producers</h3><table id='topic-nodes'><tr><th class='name'>NSQd Host</th><th>Depth</th><th>Memory + Disk</th>" +
          "<th>Messages</th><th>Channels</th><th>E2E Processing Latency</th></tr>" + nodes +
          "<tr class='total' data-node='*'><td class='name'>Total</td>" + cells(doc, TOPIC_COLS) + "<td>" +
          num((doc.channels || []).length) + "</td><td>" + e2eCells(doc.e2e_processing_latency) + "</td></tr></table>" +
          "<h3>Channels</h3>" + (chans ? "<table id='topic-channels'><tr><th class='name'>Channel</th>" +
          CHANNEL_COLS.map(function (c) { return "<th>" + c[1] + "</th>"; }).join("") + "<th>E2E Processing Latency</th></tr>" +
          chans + "</table>" : "<p class='muted' id='topic-channels'>no channels</p>");
      }, showError);
    }
    pageEl.addEventListener("click", function tombstone(ev) {
      var b = ev.target.closest("button[data-tombstone]");
      if (!b) { return; }
      var node = b.getAttribute("data-tombstone");
      confirmThen("Are you sure you want to tombstone " + node + " for topic " + topic + "?", function () {
        act(api("DELETE", "api/nodes/" + enc(node), {topic: topic}), reload);
      });
    });
    every(SAMPLE_MS, reload);
  }

  function clientAttrs(c) {
    var a = [];
    if (c.tls) { a.push("TLS " + (c.tls_version || "")); }
    if (c.authed) { a.push("auth " + (c.auth_identity || "")); }
    if (c.deflate) { a.push("deflate"); }
    if (c.snappy) { a.push("snappy"); }
    if (c.sample_rate) { a.push("sampled " + c.sample_rate + "%"); }
    return a.map(function (x) { return "<span class='badge'>" + esc(x) + "</span>"; }).join("");
  }

  // nsqpy's policies (max attempts + dead letter, TTL, bounded channels): only for a channel that has one on some
  // node or counted a drop (Go nsqd's stats have no such fields, and then nothing is shown)
  var POLICY_COLS = [["dead_lettered_count", "Dead-Lettered"], ["expired_count", "Expired"], ["dropped_count", "Dropped"]];
  var POLICY_FIELDS = ["max_attempts", "dead_letter_topic", "message_ttl_ms", "max_depth", "max_bytes", "overflow"];

  function policyText(p) {
    if (!p) { return "<span class='muted'>off</span>"; }
    return POLICY_FIELDS.map(function (k) { return esc(k) + "=" + esc(String(p[k])); }).join(" ");
  }

  function policyTable(doc) {
    var rows = (doc.nodes || []).filter(function (n) { return n.dropped_count !== undefined; });
    if (!rows.length && doc.dropped_count === undefined) { return ""; }
    var body = rows.map(function (n) {
      return "<tr data-node='" + esc(n.node) + "'><td class='name'>" + esc(n.hostname) + " <span class='muted'>" + esc(n.node) +
        "</span></td>" + cells(n, POLICY_COLS) + "<td class='name' data-field='policy'>" + policyText(n.policy) + "</td></tr>";
    }).join("");
    return "<h3>Policies</h3><table id='channel-policies'><tr><th class='name'>NSQd Host</th>" +
      POLICY_COLS.map(function (c) { return "<th>" + c[1] + "</th>"; }).join("") + "<th class='name'>Effective Policy</th></tr>" +
      body + "<tr class='total' data-node='*'><td class='name'>Total</td>" + cells(doc, POLICY_COLS) +
      "<td class='name' data-field='policy'>" + policyText(doc.policy) + "</td></tr></table>";
  }

  function channelPage(topic, channel) {
    pageEl.innerHTML = "<h2>Topic <a data-nav href='topics/" + esc(enc(topic)) + "'>" + esc(topic) + "</a> / Channel <span id='channel-name'>" +
      esc(channel) + "</span> <span id='channel-state'></span></h2><div id='channel-actions'></div>" +
      "<div class='charts' id='charts'></div><div id='channel-body'></div>";
    var sampler = new Sampler(document.getElementById("charts"), [
      {key: "delivery_rate", title: "delivery rate", unit: "msg/s", rate: true, get: function (d) { return d.message_count || 0; }},
      {key: "depth", title: "depth", get: function (d) { return d.depth || 0; }},
      {key: "in_flight", title: "in flight", get: function (d) { return d.in_flight_count || 0; }},
      {key: "requeue_rate", title: "requeue + timeout rate", unit: "msg/s", rate: true,
        get: function (d) { return (d.requeue_count || 0) + (d.timeout_count || 0); }},
      {key: "e2e_p99", title: "e2e latency, top percentile", unit: "ms", get: function (d) { return p99(d.e2e_processing_latency); }}
    ]);
    var shownPaused = null;
    function reload() {
      api("GET", "api/topics/" + enc(topic) + "/" + enc(channel)).then(function (doc) {
        showError(null);
        showWarning(doc.message);
        if (doc.channel_name === undefined) {
          document.getElementById("channel-body").innerHTML = "<p class='muted' id='channel-nodes'>no such channel on any node</p>";
          return;
        }
        sampler.add(doc);
        if (shownPaused !== doc.paused) {
          shownPaused = doc.paused;
          var actions = document.getElementById("channel-actions");
          actions.innerHTML = "";
          actionButtons(actions, "api/topics/" + enc(topic) + "/" + enc(channel), "Channel", doc.paused,
            function () { navigate("topics/" + enc(topic)); }, reload);
        }
        document.getElementById("channel-state").innerHTML = doc.paused ? "<span class='badge paused'>paused</span>" : "";
        var nodes = (doc.nodes || []).map(function (n) {
          return "<tr data-node='" + esc(n.node) + "'><td class='name'><a data-nav href='nodes/" + esc(enc(n.node)) + "'>" +
            esc(n.hostname) + " <span class='muted'>" + esc(n.node) + "</span></a>" +
            (n.paused ? "<span class='badge paused'>paused</span>" : "") + "</td>" + cells(n, CHANNEL_COLS) +
            "<td>" + e2eCells(n.e2e_processing_latency) + "</td></tr>";
        }).join("");
        var clients = (doc.clients || []).map(function (c) {
          return "<tr data-client='" + esc(c.remote_address) + "'><td class='name'>" + esc(c.hostname) + " <span class='muted'>" +
            esc(c.remote_address) + "</span></td><td class='name'>" + esc(c.user_agent || c.version) + "</td><td class='name'>" +
            clientAttrs(c) + "</td><td class='name'>" + esc(c.node) + "</td>" +
            "<td data-field='in_flight_count'>" + num(c.in_flight_count) + "</td><td data-field='ready_count'>" + num(c.ready_count) +
            "</td><td data-field='finish_count'>" + num(c.finish_count) + "</td><td data-field='requeue_count'>" + num(c.requeue_count) +
            "</td><td data-field='message_count'>" + num(c.message_count) + "</td><td data-field='connected'>" +
            esc(fmtDuration(c.connected)) + "</td></tr>";
        }).join("");
        document.getElementById("channel-body").innerHTML =
          "<table id='channel-nodes'><tr><th class='name'>NSQd Host</th>" +
          CHANNEL_COLS.map(function (c) { return "<th>" + c[1] + "</th>"; }).join("") + "<th>E2E Processing Latency</th></tr>" +
          nodes + "<tr class='total' data-node='*'><td class='name'>Total</td>" + cells(doc, CHANNEL_COLS) + "<td>" +
          e2eCells(doc.e2e_processing_latency) + "</td></tr></table>" + policyTable(doc) +
          "<h3>Client Connections</h3>" + (clients ? "<table id='channel-clients'><tr><th class='name'>Client Host</th>" +
          "<th class='name'>User-Agent</th><th class='name'>Attributes</th><th class='name'>NSQd Host</th><th>In-Flight</th>" +
          "<th>Ready Count</th><th>Finished</th><th>Requeued</th><th>Messages</th><th>Connected</th></tr>" + clients + "</table>" :
          "<p class='muted' id='channel-clients'>no clients</p>");
      }, showError);
    }
    every(SAMPLE_MS, reload);
  }

  function nodesPage() {
    api("GET", "api/nodes").then(function (doc) {
      showWarning(doc.message);
      var nl = (S.nsqlookupd || []).length;
      var rows = (doc.nodes || []).map(function (n) {
        var node = n.broadcast_address.indexOf(":") >= 0 ? "[" + n.broadcast_address + "]:" + n.http_port :
          n.broadcast_address + ":" + n.http_port;
        var tomb = (n.topics || []).filter(function (t) { return t.tombstoned; });
        return "<tr data-node='" + esc(node) + "'><td class='name'><a data-nav href='nodes/" + esc(enc(node)) + "'>" +
          esc(n.hostname) + "</a></td><td class='name'>" + esc(n.broadcast_address) + "</td><td>" + esc(n.tcp_port) + "</td><td>" +
          esc(n.http_port) + "</td><td class='name'>" + esc(n.version) + (n.out_of_date ? " <span class='badge paused'>out of date</span>" : "") +
          "</td>" + (nl ? "<td>" + esc((n.remote_addresses || []).length) + "/" + nl + "</td>" : "") +
          "<td data-field='topics'>" + num((n.topics || []).length) + "</td><td class='name'>" +
          tomb.map(function (t) { return "<span class='badge'>" + esc(t.topic) + "</span>"; }).join("") + "</td></tr>";
      }).join("");
      pageEl.innerHTML = "<h2>NSQd Nodes (<span id='node-count'>" + (doc.nodes || []).length + "</span>)</h2>" +
        "<table id='nodes'><tr><th class='name'>Hostname</th><th class='name'>Broadcast Address</th><th>TCP Port</th>" +
        "<th>HTTP Port</th><th class='name'>Version</th>" + (nl ? "<th>Lookupd Conns.</th>" : "") +
        "<th>Topics</th><th class='name'>Tombstoned Topics</th></tr>" + rows + "</table>";
    }, showError);
  }

  function nodePage(node) {
    api("GET", "api/nodes/" + enc(node)).then(function (doc) {
      showWarning(doc.message);
      var body = (doc.topics || []).map(function (t) {
        var chans = (t.channels || []).map(function (c) {
          return "<tr data-channel='" + esc(t.topic_name + "/" + c.channel_name) + "'><td class='name'>&nbsp;&nbsp;<a data-nav href='topics/" +
            esc(enc(t.topic_name)) + "/" + esc(enc(c.channel_name)) + "'>" + esc(c.channel_name) + "</a></td>" +
            cells(c, CHANNEL_COLS) + "</tr>";
        }).join("");
        return "<tr class='total' data-topic='" + esc(t.topic_name) + "'><td class='name'><a data-nav href='topics/" + esc(enc(t.topic_name)) + "'>" +
          esc(t.topic_name) + "</a>" + (t.paused ? "<span class='badge paused'>paused</span>" : "") + "</td><td data-field='depth'>" + num(t.depth) +
          "</td><td>" + memDisk(t) + "</td><td></td><td></td><td></td><td></td><td data-field='message_count'>" +
          num(t.message_count) + "</td><td>" + num((t.channels || []).length) + " channels</td></tr>" + chans;
      }).join("");
      pageEl.innerHTML = "<h2>Node <span id='node-name'>" + esc(doc.node) + "</span></h2>" +
        "<p>Total messages: <b id='total-messages'>" + num(doc.total_messages) + "</b> &nbsp; Clients: <b id='total-clients'>" +
        num(doc.total_clients) + "</b></p><table id='node-topics'><tr><th class='name'>Topic / Channel</th>" +
        CHANNEL_COLS.map(function (c) { return "<th>" + c[1] + "</th>"; }).join("") + "</tr>" + body + "</table>";
    }, showError);
  }

  function counterPage() {
    pageEl.innerHTML = "<h2>Messages processed</h2><div class='counter-big' id='counter'>-</div>" +
      "<div class='muted'>over every topic, channel and node; rate from successive samples</div>" +
      "<div class='charts' id='charts'></div>";
    var sampler = new Sampler(document.getElementById("charts"), [
      {key: "message_rate", title: "messages/s, cluster", unit: "msg/s", rate: true, get: function (d) { return d.total; }}
    ]);
    every(SAMPLE_MS, function () {
      api("GET", "api/counter").then(function (doc) {
        showError(null);
        showWarning(doc.message);
        var total = 0;
        Object.keys(doc.stats || {}).forEach(function (k) { total += doc.stats[k].message_count; });
        document.getElementById("counter").textContent = num(total);
        sampler.add({total: total});
      }, showError);
    });
  }

  function lookupPage() {
    if (!(S.nsqlookupd || []).length) {
      pageEl.innerHTML = "<h2>Lookup</h2><p class='muted'>nsqadmin was started with --nsqd-http-address: no nsqlookupd to ask.</p>";
      return;
    }
    function reload() {
      api("GET", "api/topics?inactive=true").then(function (doc) {
        showWarning(doc.message);
        var topics = Object.keys(doc.topics || {}).sort();
        var rows = topics.map(function (t) {
          var chans = (doc.topics[t] || []).map(function (c) {
            return "<li data-channel='" + esc(c) + "'>" + esc(c) + (S.is_admin ? " <button class='tomb' data-delete-channel='" + esc(c) +
              "' data-topic='" + esc(t) + "' title='delete channel'>&#x2718;</button>" : "") + "</li>";
          }).join("");
          return "<li data-topic='" + esc(t) + "'><b>" + esc(t) + "</b>" + (S.is_admin ? " <button class='tomb' data-delete-topic='" +
            esc(t) + "' title='delete topic'>&#x2718;</button>" : "") + (chans ? "<ul>" + chans + "</ul>" : "") + "</li>";
        }).join("");
        pageEl.innerHTML = "<h2>Lookup</h2><p class='muted'>nsqlookupd: " + esc(S.nsqlookupd.join(", ")) + "</p>" +
          "<h3>Inactive topics and channels</h3>" + (rows ? "<ul id='inactive'>" + rows + "</ul>" : "<p class='muted' id='inactive'>none</p>") +
          (S.is_admin ? "<h3>Create topic / channel</h3><form class='create' id='create'><input name='topic' id='create-topic' placeholder='topic'>" +
          "<input name='channel' id='create-channel' placeholder='channel (optional)'><button type='submit' id='create-submit'>Create</button></form>" +
          "<p class='muted'>Creating a topic or channel registers it in nsqlookupd; it becomes active once an nsqd has it.</p>" : "");
        var form = document.getElementById("create");
        if (form) {
          form.addEventListener("submit", function (ev) {
            ev.preventDefault();
            var body = {topic: form.topic.value};
            if (form.channel.value) { body.channel = form.channel.value; }
            act(api("POST", "api/topics", body), reload);
          });
        }
      }, showError);
    }
    pageEl.onclick = function (ev) {
      var t = ev.target.closest("button[data-delete-topic]");
      var c = ev.target.closest("button[data-delete-channel]");
      if (t) {
        confirmThen("Delete topic " + t.getAttribute("data-delete-topic") + "?", function () {
          act(api("DELETE", "api/topics/" + enc(t.getAttribute("data-delete-topic"))), reload);
        });
      } else if (c) {
        confirmThen("Delete channel " + c.getAttribute("data-delete-channel") + "?", function () {
          act(api("DELETE", "api/topics/" + enc(c.getAttribute("data-topic")) + "/" + enc(c.getAttribute("data-delete-channel"))), reload);
        });
      }
    };
    reload();
  }

  // ---- the health strip ----------------------------------------------------------------------------------

  function chip(cls, text, title) {
    return "<span class='chip " + cls + "'" + (title ? " title='" + esc(title) + "'" : "") + ">" + esc(text) + "</span>";
  }

  function health() {
    api("GET", "api/health").then(function (h) {
      var nodes = h.nodes || [];
      var up = nodes.filter(function (n) { return n.ok; }).length;
      var html = chip(up === nodes.length && nodes.length ? "" : "bad", up + "/" + nodes.length + " nodes answering");
      (h.down || []).forEach(function (d) { html += chip("bad down", "down: " + d.node, d.error); });
      (h.restarted || []).forEach(function (r) { html += chip("note restarted", "restarted: " + r.node, r.why); });
      (h.growing || []).forEach(function (g) {
        html += chip("note growing", "depth growing: " + g.topic + "/" + g.channel + " on " + g.node + " (" + g.depth + ")");
      });
      (h.stuck || []).forEach(function (s) {
        html += chip("note stuck", "stuck client: " + s.remote_address + " on " + s.topic + "/" + s.channel + " (RDY " + s.ready_count + ", 0 in flight)");
      });
      if (h.message) { html += chip("bad", h.message); }
      var el = document.getElementById("health");
      el.innerHTML = html;
      el.setAttribute("data-sampled-at", String(h.sampled_at));
    }, function (err) {
      document.getElementById("health").innerHTML = chip("bad", "nsqadmin: " + err.message);
    });
  }

  // ---- the router ----------------------------------------------------------------------------------------

  function route() {
    stopTimers();
    showWarning(null);
    showError(null);
    pageEl.onclick = null;
    var fresh = pageEl.cloneNode(false);  // drops the previous page's listeners
    pageEl.parentNode.replaceChild(fresh, pageEl);
    pageEl = fresh;
    var path = location.pathname;
    if (BASE && path.indexOf(BASE) === 0) { path = path.slice(BASE.length); }
    var parts = path.split("/").filter(Boolean).map(decodeURIComponent);
    var active = parts[0] || "topics";
    document.querySelectorAll(".bar nav a").forEach(function (a) {
      a.classList.toggle("active", a.getAttribute("href") === active);
    });
    pageEl.setAttribute("data-page", parts.length ? parts[0] + (parts.length > 1 ? "/" + (parts.length - 1) : "") : "topics");
    if (!parts.length || (parts[0] === "topics" && parts.length === 1)) { topicsPage(); }
    else if (parts[0] === "topics" && parts.length === 2) { topicPage(parts[1]); }
    else if (parts[0] === "topics" && parts.length === 3) { channelPage(parts[1], parts[2]); }
    else if (parts[0] === "nodes" && parts.length === 1) { nodesPage(); }
    else if (parts[0] === "nodes" && parts.length === 2) { nodePage(parts[1]); }
    else if (parts[0] === "counter") { counterPage(); }
    else if (parts[0] === "lookup") { lookupPage(); }
    else { pageEl.innerHTML = "<h2>Not found</h2>"; }
    every(HEALTH_MS, health);
  }

  route();
}());
