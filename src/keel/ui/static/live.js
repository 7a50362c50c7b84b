// Keel's only script: a running run's page follows the store through server-sent events.
// The server sends HTML it rendered and escaped itself: rows to append, summary and charts to
// replace, the answer being written. Nothing here builds markup from data.
(function () {
  "use strict";
  var body = document.body;
  var url = body.dataset.live;
  if (!url || !window.EventSource) return;
  var source = new EventSource(url + "?after=" + encodeURIComponent(body.dataset.seq || "-1"));
  source.addEventListener("update", function (message) {
    var data = JSON.parse(message.data);
    if (data.rows) {
      document.getElementById("timeline").insertAdjacentHTML("beforeend", data.rows);
    }
    ["summary", "charts"].forEach(function (id) {
      if (typeof data[id] === "string") document.getElementById(id).innerHTML = data[id];
    });
    body.dataset.seq = String(data.seq);
  });
  source.addEventListener("text", function (message) {
    document.getElementById("live-answer").innerHTML = JSON.parse(message.data).html;
  });
  source.addEventListener("end", function () {
    source.close();
    body.dataset.ended = "true";
  });
})();
