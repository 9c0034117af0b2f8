// The live log: new batches from /log/events (server-sent events), drawn as text (never as HTML).
// It keeps the newest data-keep rows (older ones are dropped) and shows the log's head as it moves.
(function () {
  "use strict";
  var live = document.getElementById("live");
  var body = document.getElementById("batches");
  var head = document.getElementById("log-head");
  if (!live || !body || !window.EventSource) { return; }
  var params = new URLSearchParams(window.location.search);
  params.delete("before");
  params.set("after", live.getAttribute("data-after"));
  var source = new EventSource("/log/events?" + params.toString());
  function cell(text) {
    var td = document.createElement("td");
    td.textContent = text;
    return td;
  }
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
    var writes = cell(batch.summary);
    var links = document.createElement("div");
    links.className = "links";
    (batch.links || []).forEach(function (found) {
      if (typeof found.href !== "string" || found.href.charAt(0) !== "/" || found.href.charAt(1) === "/") { return; }
      var a = document.createElement("a");
      a.href = found.href;
      a.textContent = String(found.text);
      links.appendChild(a);
    });
    writes.appendChild(links);
    row.appendChild(seq); row.appendChild(cell(batch.when)); row.appendChild(writes);
    body.insertBefore(row, body.firstChild);
    var keep = parseInt(live.getAttribute("data-keep") || "200", 10);
    if (body.rows.length > keep) {
      while (body.rows.length > keep) { body.deleteRow(body.rows.length - 1); }
      var last = parseInt(body.rows[body.rows.length - 1].getAttribute("data-seq"), 10);
      var older = document.getElementById("older");
      if (older) {  // the dropped rows stay one click away
        var query = new URLSearchParams(window.location.search);
        query.set("before", String(last - 1));
        older.href = "?" + query.toString();
        older.parentNode.hidden = false;
      }
    }
    live.setAttribute("data-after", String(batch.seq));
  });
  source.addEventListener("head", function (event) {
    if (head) { head.textContent = String(parseInt(event.data, 10)); }
  });
  source.onerror = function () { live.classList.add("down"); };
  source.onopen = function () { live.classList.remove("down"); };
})();
