// Times on charts as the pages print them (apps/fleet/templatetags/fleet_tags.py `when` and
// `clock`): 24-hour, year-month-day, in the server's time zone (FLEETDECK_TIME_ZONE, on <body>),
// not the browser's, so a chart's 15:04 is the table's 15:04 beside it.
window.FleetdeckClock = (function () {
  let format;
  const parts = (ms) => {
    if (!format) {
      const timeZone = (document.body && document.body.dataset.timeZone) || "UTC";
      format = new Intl.DateTimeFormat("en-GB", {
        timeZone, year: "numeric", month: "2-digit", day: "2-digit",
        hour: "2-digit", minute: "2-digit", second: "2-digit", hourCycle: "h23",
      });
    }
    return Object.fromEntries(format.formatToParts(new Date(ms)).map((p) => [p.type, p.value]));
  };
  return {
    when(ms) {
      const p = parts(ms);
      return `${p.year}-${p.month}-${p.day} ${p.hour}:${p.minute}:${p.second}`;
    },
    clock(ms) {
      const p = parts(ms);
      return `${p.hour}:${p.minute}:${p.second}`;
    },
  };
})();
