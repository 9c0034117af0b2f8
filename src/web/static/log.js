// The live log: new batches from /log/events (server-sent events), drawn as text (never as HTML).
(function () {
  "use strict";
  var live = document.getElementById("live");
  var body = document.getElementById("batches");
  if (!live || !body || !window.EventSource) { return; }
  var params = new URLSearchParams(window.location.search);
  params.delete("before");
  params.set("after", live.getAttribute("data-after"));
  var source = new EventSource("/log/events?" + params.toString());
  source.addEventListener("batch", function (event) {
    var batch = JSON.parse(event.data);
    var empty = body.querySelector("tr.empty");
    if (empty) { empty.remove(); }
    var row = document.createElement("tr");
    row.setAttribute("data-seq", String(batch.seq));
    row.className = "new";
    var seq = document.createElement("td");
    var link = document.createElement("a");
    link.href = "/log/" + encodeURIComponent(String(batch.seq));
    link.textContent = String(batch.seq);
    seq.appendChild(link);
    var when = document.createElement("td");
    when.textContent = batch.when;
    var writes = document.createElement("td");
    writes.textContent = batch.summary;
    row.appendChild(seq); row.appendChild(when); row.appendChild(writes);
    body.insertBefore(row, body.firstChild);
    live.setAttribute("data-after", String(batch.seq));
  });
  source.onerror = function () { live.classList.add("down"); };
  source.onopen = function () { live.classList.remove("down"); };
})();
