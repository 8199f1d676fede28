// A deployment's request sizes over time, drawn from the JSON its page embeds
// (apps/incidents/templatetags/incidents_tags.py): p50, p90 and p99 of each reading's requests,
// and of the generated tokens where vLLM counts them. A script file: the pages' CSP allows
// scripts from this site only.
(function () {
  const source = document.getElementById("request-sizes-data");
  const canvas = document.getElementById("request-sizes-chart");
  if (!source || !canvas || !window.Chart) return;
  const d = JSON.parse(source.textContent);
  if (!d) return;
  const series = (points, key) => points.filter((p) => p[key] !== null).map((p) => ({ x: p.t, y: p[key] }));
  const line = (label, points, key, color, dash) => ({ label, data: series(points, key), borderColor: color, backgroundColor: color, pointRadius: 1, borderWidth: 2, borderDash: dash || [] });
  const datasets = [
    line("p50", d.input, "p50", "#2f855a"),
    line("p90", d.input, "p90", "#b7791f"),
    line("p99", d.input, "p99", "#c53030"),
  ];
  if (d.output.length) {
    datasets.push(line("generated p50", d.output, "p50", "#2f855a", [6, 4]), line("generated p99", d.output, "p99", "#c53030", [6, 4]));
  }
  new Chart(canvas, {
    type: "line",
    data: { datasets },
    options: {
      animation: false,
      parsing: false,
      plugins: {
        legend: { position: "bottom" },
        tooltip: { callbacks: { title: (items) => (items.length ? FleetdeckClock.when(items[0].parsed.x) : "") } },
      },
      scales: {
        x: { type: "linear", ticks: { callback: FleetdeckClock.clock, maxTicksLimit: 8 } },
        y: { beginAtZero: true, title: { display: true, text: d.unit } },
      },
    },
  });
})();
