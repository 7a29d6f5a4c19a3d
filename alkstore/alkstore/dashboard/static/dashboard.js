// alkstore dashboard: refreshes the page's main content in place and draws
// the throughput charts from the data the page carries. The pages read the
// same without it (the server renders everything).
(function () {
  "use strict";
  var SVG = "http://www.w3.org/2000/svg";
  var COLORS = { completed: "#2e7d32", retried: "#f0a202", dead: "#c62828" };

  function el(name, attrs) {
    var node = document.createElementNS(SVG, name);
    Object.keys(attrs || {}).forEach(function (key) {
      node.setAttribute(key, String(attrs[key]));
    });
    return node;
  }

  function drawChart(figure) {
    var data;
    try {
      data = JSON.parse(figure.getAttribute("data-throughput"));
    } catch (e) {
      return;
    }
    var width = Number(figure.getAttribute("data-width")) || 240;
    var height = Number(figure.getAttribute("data-height")) || 48;
    var n = data.completed.length;
    var max = 1;
    for (var i = 0; i < n; i++) {
      max = Math.max(max, data.completed[i] + data.retried[i] + data.dead[i]);
    }
    var svg = el("svg", {
      class: "throughput",
      width: width,
      height: height,
      viewBox: "0 0 " + width + " " + height,
      role: "img",
      "aria-label": figure.getAttribute("data-label") || "throughput",
    });
    svg.appendChild(el("line", { x1: 0, y1: height - 0.5, x2: width, y2: height - 0.5, class: "axis" }));
    var step = width / n;
    var start = Date.parse(data.start);
    for (var m = 0; m < n; m++) {
      var y = height - 1;
      var title = [];
      ["completed", "retried", "dead"].forEach(function (kind) {
        var value = data[kind][m];
        if (!value) return;
        var h = Math.max(1, ((height - 2) * value) / max);
        y -= h;
        svg.appendChild(
          el("rect", {
            x: (m * step + 0.5).toFixed(1),
            y: y.toFixed(1),
            width: Math.max(1, step - 1).toFixed(1),
            height: h.toFixed(1),
            fill: COLORS[kind],
            "data-kind": kind,
            "data-minute": m,
          })
        );
        title.push(value + " " + kind);
      });
      if (title.length) {
        var minute = new Date(start + m * data.step_s * 1000).toISOString().slice(11, 16);
        var hover = el("rect", {
          x: (m * step).toFixed(1), y: 0, width: step.toFixed(1), height: height, class: "hover",
        });
        var t = el("title");
        t.textContent = minute + " UTC: " + title.join(", ");
        hover.appendChild(t);
        svg.appendChild(hover);
      }
    }
    var area = figure.querySelector(".chart-area");
    if (area) area.replaceChildren(svg);
  }

  function drawCharts(root) {
    root.querySelectorAll("[data-throughput]").forEach(drawChart);
  }

  function busy(main) {
    var active = document.activeElement;
    if (active && main.contains(active) && /^(INPUT|SELECT|TEXTAREA)$/.test(active.tagName)) {
      return true;
    }
    // A purge's "older than" or a login's token being typed is not thrown away.
    return Array.prototype.some.call(main.querySelectorAll("input:not([type=hidden])"), function (input) {
      return input.type === "checkbox" ? input.checked : input.value !== input.defaultValue;
    });
  }

  function start() {
    var main = document.getElementById("content");
    if (!main) return;
    drawCharts(main);
    var every = Number(document.body.getAttribute("data-refresh")) || 0;
    if (every <= 0) return;
    var status = document.getElementById("refresh-status");
    var paused = false;
    var inFlight = false;
    if (status) {
      var toggle = document.createElement("button");
      toggle.type = "button";
      toggle.id = "refresh-toggle";
      toggle.textContent = "Pause refresh";
      toggle.addEventListener("click", function () {
        paused = !paused;
        toggle.textContent = paused ? "Resume refresh" : "Pause refresh";
        say(paused ? "refresh paused" : "refresh resumed");
      });
      status.parentNode.insertBefore(toggle, status);
    }
    function say(text) {
      if (status) status.textContent = text;
    }
    function refresh() {
      if (paused || inFlight || document.hidden || busy(main)) return;
      inFlight = true;
      fetch(window.location.href, {
        credentials: "same-origin",
        cache: "no-store",
        headers: { "X-Alkstore-Refresh": "1" },
      })
        .then(function (response) {
          if (!response.ok && response.status >= 500) throw new Error("HTTP " + response.status);
          return response.text();
        })
        .then(function (text) {
          var doc = new DOMParser().parseFromString(text, "text/html");
          var fresh = doc.getElementById("content");
          if (!fresh) throw new Error("no content");
          var open = Array.prototype.map.call(main.querySelectorAll("details[open]"), function (d) {
            var figure = d.closest("[data-label]");
            return figure ? figure.getAttribute("data-label") : "";
          });
          var node = document.importNode(fresh, true);
          node.querySelectorAll("details").forEach(function (d) {
            var figure = d.closest("[data-label]");
            if (figure && open.indexOf(figure.getAttribute("data-label")) >= 0) d.open = true;
          });
          main.replaceWith(node);
          main = node;
          drawCharts(main);
          document.title = doc.title;
          say("updated " + new Date().toISOString().slice(11, 19) + "Z");
        })
        .catch(function (error) {
          say("refresh failed: " + error.message);
        })
        .finally(function () {
          inFlight = false;
        });
    }
    window.setInterval(refresh, every * 1000);
  }

  if (document.readyState === "loading") {
    document.addEventListener("DOMContentLoaded", start);
  } else {
    start();
  }
})();
