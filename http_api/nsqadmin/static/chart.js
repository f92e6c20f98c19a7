/* A small live line chart on a canvas: successive samples in, a redrawn line out (no library, no server).
 *
 *   var c = new LiveChart(parentElement, "publish rate", "msg/s");
 *   c.push(Date.now(), 12.5);      // one point per sample; the last MAX_POINTS are kept
 *
 * The number of points drawn is kept in the canvas's data-points attribute (tests read it).
 */
(function (global) {
  "use strict";
  var MAX_POINTS = 150;

  function fmt(v) {
    if (v === null || v === undefined || isNaN(v)) { return "-"; }
    var a = Math.abs(v);
    if (a >= 1e9) { return (v / 1e9).toFixed(1) + "G"; }
    if (a >= 1e6) { return (v / 1e6).toFixed(1) + "M"; }
    if (a >= 1e4) { return (v / 1e3).toFixed(1) + "k"; }
    if (a >= 100 || v === Math.round(v)) { return String(Math.round(v)); }
    return v.toFixed(2);
  }

  function LiveChart(parent, title, unit, key) {
    this.points = [];
    this.unit = unit || "";
    var box = document.createElement("div");
    box.className = "chart";
    if (key) { box.setAttribute("data-chart", key); }
    var head = document.createElement("div");
    head.className = "title";
    this.label = document.createElement("span");
    this.label.textContent = title;
    this.now = document.createElement("span");
    this.now.className = "now";
    head.appendChild(this.label);
    head.appendChild(this.now);
    this.canvas = document.createElement("canvas");
    this.canvas.width = 320;
    this.canvas.height = 110;
    this.canvas.setAttribute("data-points", "0");
    box.appendChild(head);
    box.appendChild(this.canvas);
    parent.appendChild(box);
  }

  LiveChart.prototype.push = function (t, v) {
    this.points.push([t, v]);
    if (this.points.length > MAX_POINTS) { this.points.shift(); }
    this.canvas.setAttribute("data-points", String(this.points.length));
    this.now.textContent = fmt(v) + (this.unit ? " " + this.unit : "");
    this.draw();
  };

  LiveChart.prototype.draw = function () {
    var ctx = this.canvas.getContext("2d");
    var w = this.canvas.width, h = this.canvas.height, pad = 4, left = 34;
    ctx.clearRect(0, 0, w, h);
    var pts = this.points.filter(function (p) { return p[1] !== null && !isNaN(p[1]); });
    var max = 0, min = 0;
    pts.forEach(function (p) { if (p[1] > max) { max = p[1]; } if (p[1] < min) { min = p[1]; } });
    if (max === min) { max = min + 1; }
    ctx.fillStyle = "#778";
    ctx.font = "10px sans-serif";
    ctx.fillText(fmt(max), 2, 10);
    ctx.fillText(fmt(min), 2, h - pad);
    ctx.strokeStyle = "#e3e7ec";
    ctx.beginPath();
    ctx.moveTo(left, pad); ctx.lineTo(left, h - pad); ctx.lineTo(w - pad, h - pad);
    ctx.stroke();
    if (pts.length === 0) { return; }
    var t0 = pts[0][0], t1 = pts[pts.length - 1][0];
    var span = Math.max(t1 - t0, 1);
    ctx.strokeStyle = "#2a6fb0";
    ctx.lineWidth = 1.5;
    ctx.beginPath();
    pts.forEach(function (p, i) {
      var x = pts.length === 1 ? w - pad : left + (p[0] - t0) / span * (w - pad - left);
      var y = h - pad - (p[1] - min) / (max - min) * (h - 2 * pad);
      if (i === 0) { ctx.moveTo(x, y); } else { ctx.lineTo(x, y); }
    });
    ctx.stroke();
    if (pts.length === 1) {
      ctx.fillStyle = "#2a6fb0";
      ctx.fillRect(w - pad - 2, h - pad - (pts[0][1] - min) / (max - min) * (h - 2 * pad) - 2, 4, 4);
    }
  };

  global.LiveChart = LiveChart;
  global.fmtNumber = fmt;
}(window));
