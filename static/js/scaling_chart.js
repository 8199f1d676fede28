// A deployment's target and running replicas over time, drawn from the JSON its page embeds
// (apps/fleet/scaling_history.py): step lines, since a count holds until the next sample, and the
// autoscaler's decisions as markers at the new target. A script file: the pages' CSP allows
// scripts from this site only.
(function () {
  const source = document.getElementById("scaling-chart-data");
  const canvas = document.getElementById("scaling-chart");
  if (!source || !canvas || !window.Chart) return;
  const d = JSON.parse(source.textContent);
  const now = Math.max(d.end, Date.now());
  // The last count holds until now: extend each line to the right edge.
  const held = (points) => (points.length ? points.concat([[now, points[points.length - 1][1]]]) : points);
  const line = (label, data, color, extra) => ({ label, data: held(data), borderColor: color, backgroundColor: color, stepped: "before", pointRadius: 2, borderWidth: 2, ...extra });
  const decisions = d.decisions.map((x) => ({ x: x.t, y: x.to, reason: x.reason, from: x.from }));
  new Chart(canvas, {
    type: "line",
    data: {
      datasets: [
        line("target replicas", d.target, "#2b6cb0", { borderDash: [6, 4] }),
        line("running replicas", d.running, "#2f855a"),
        { type: "scatter", label: "autoscaler decision", data: decisions, backgroundColor: "#c53030", borderColor: "#c53030", pointRadius: 7, pointStyle: "triangle" },
      ],
    },
    options: {
      animation: false,
      parsing: false,
      plugins: {
        legend: { position: "bottom" },
        tooltip: {
          callbacks: {
            title: (items) => (items.length ? FleetdeckClock.when(items[0].parsed.x) : ""),
            label: (item) => (item.raw && item.raw.reason !== undefined ? `${item.raw.from} → ${item.raw.y}: ${item.raw.reason}` : `${item.dataset.label}: ${item.parsed.y}`),
          },
        },
      },
      scales: {
        x: { type: "linear", min: d.start, max: now, ticks: { callback: FleetdeckClock.clock, maxTicksLimit: 8 } },
        y: { beginAtZero: true, ticks: { precision: 0 }, title: { display: true, text: "replicas" } },
      },
    },
  });
})();
