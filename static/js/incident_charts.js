// An incident's evidence charts, drawn from the JSON its page embeds (apps/incidents/charts.py).
// Every chart shares one time axis, the readings kept with the incident, so a kill lines up with
// the memory and the latency around it. A script file rather than inline: the page's
// Content-Security-Policy allows scripts from this site only.
(function () {
  const source = document.getElementById("incident-chart-data");
  if (!source || !window.Chart) return;
  const d = JSON.parse(source.textContent);
  const kills = d.kills || [];
  const RED = "#c53030";
  const COLORS = ["#2b6cb0", "#2f855a", "#b7791f", "#6b46c1"];

  // A little room at both ends, so a kill at the last reading is not cut in half by the edge.
  const pad = Math.max((d.end - d.start) * 0.02, 15000);
  const [from, to] = [d.start - pad, d.end + pad];
  const clock = FleetdeckClock.clock;
  const options = (scales) => ({
    animation: false,
    spanGaps: true,
    plugins: {
      legend: { position: "bottom" },
      tooltip: { callbacks: { title: (items) => (items.length ? FleetdeckClock.when(items[0].parsed.x) : "") } },
    },
    scales: {
      x: { type: "linear", min: from, max: to, title: { display: true, text: "time" }, ticks: { callback: clock, maxTicksLimit: 8, includeBounds: false } },
      ...scales,
    },
  });
  const axis = (text, extra) => ({ beginAtZero: true, title: { display: true, text }, ...extra });
  const line = (label, data, color, extra) => ({ label, data, borderColor: color, backgroundColor: color, pointRadius: 2, borderWidth: 2, ...extra });
  const level = (label, value, color) => line(label, [[from, value], [to, value]], color, { borderDash: [6, 4], borderWidth: 1, pointRadius: 0 });
  const markers = (label, data) => ({ type: "scatter", label, data, backgroundColor: RED, borderColor: RED, pointRadius: 7, pointStyle: "triangle" });
  const draw = (id, datasets, y, more) => {
    const canvas = document.getElementById(id);
    if (canvas) new Chart(canvas, { type: "line", data: { datasets }, options: options({ y, ...more }) });
  };
  const at = (key) => kills.filter((k) => k[key] !== null && k[key] !== undefined).map((k) => [k.t, k[key]]);

  if (d.node_share) {
    const percent = (v) => `${Math.round(v * 100)} %`;
    draw("memory-chart", [
      line("node memory", d.node_share.mem, RED),
      line("GPU memory", d.node_share.gpu, "#6b46c1"),
      level("pressure limit (90 %)", 0.9, "#718096"),
    ], axis("memory used (%)", { min: 0, max: 1, ticks: { callback: percent } }));
  }

  if (d.nodes) {
    const datasets = [];
    d.nodes.forEach((node, i) => {
      const name = d.nodes.length > 1 ? ` (${node.ip})` : "";
      datasets.push(line(`memory used${name}`, node.used_gib, COLORS[i % COLORS.length]));
      if (node.threshold_gib) datasets.push(level(`Ray's memory monitor kills above${name}`, node.threshold_gib, RED));
      if (node.total_gib) datasets.push(level(`node total${name}`, node.total_gib, "#718096"));
    });
    const killed = at("node_gib");
    if (killed.length) datasets.push(markers("OOM kill (node memory Ray reported)", killed));
    draw("node-memory-chart", datasets, axis("node memory (GiB)"));
  }

  if (d.replica_mib) {
    const killed = at("replica_mib");
    draw("replica-memory-chart", [line("resident memory per replica", d.replica_mib, COLORS[0])]
      .concat(killed.length ? [markers("OOM kill (the killed replica's memory)", killed)] : []), axis("memory per replica (MiB)"));
  }

  if (d.latency) {
    const values = d.latency.p99.map((p) => p[1]).filter((v) => v !== null);
    const top = Math.max(1, ...values);
    draw("latency-chart", [
      line("p50 ms", d.latency.p50, "#4c7bd9"),
      line("p99 ms", d.latency.p99, RED),
    ].concat(kills.length ? [markers("OOM kill", kills.map((k) => [k.t, top]))] : []), axis("latency (ms)"));
    draw("load-chart", [
      line("in flight", d.load.ongoing, "#2f855a"),
      line("queued", d.load.queued, "#b7791f"),
      line("requests/s", d.load.rps, "#718096", { borderDash: [4, 4], yAxisID: "rate" }),
    ], axis("requests"), { rate: axis("requests/s", { position: "right", grid: { drawOnChartArea: false } }) });
  }
})();
