// A deployment's memory calibration curve, drawn from the JSON its card embeds
// (templates/calibration/partials/card.html). htmx swaps the card in again while a calibration
// runs, and a script in a fragment gets no nonce to run with (templates/base.html), so the page
// loads this file, and it draws the chart of every card htmx loads, the page's own first.
(function () {
  function draw(root) {
    const source = root.querySelector && root.querySelector("#calibration-chart-data");
    const canvas = source && document.getElementById("calibration-chart");
    if (!canvas || !window.Chart || Chart.getChart(canvas)) return;
    // The card htmx replaced leaves its chart registered with Chart.js, holding its canvas.
    Object.values(Chart.instances).filter((chart) => !chart.canvas.isConnected).forEach((chart) => chart.destroy());
    const d = JSON.parse(source.textContent);
    new Chart(canvas, { type: "line", data: { datasets: [
      { label: "peak MiB", data: d.points, borderColor: "#4c7bd9" },
      { label: "at rest (baseline)", data: [{ x: 0, y: d.baseline }, { x: d.x_max, y: d.baseline }], borderColor: "#718096", borderDash: [4, 4], pointRadius: 0 },
    ] }, options: { animation: false, plugins: { legend: { position: "bottom" } },
      scales: { x: { type: "linear", min: 0, title: { display: true, text: d.axis } }, y: { beginAtZero: true, title: { display: true, text: "MiB" } } } } });
  }
  document.addEventListener("htmx:load", (event) => draw(event.target));
})();
