// relocverify report: the function table, the function listing and the instruction view.
// Data arrive as <script> files calling RV.meta, RV.functions and RV.shard (file:// forbids fetch()).
// Every string from the input is shown with textContent, never parsed as HTML.
"use strict";
(function () {
  var VERDICTS = ["proved", "opaque", "unknown", "rejected", "refuted"];
  var PAGE = 100;
  var state = { meta: null, fn: null, shards: {}, waiting: {}, order: null, sortKey: "start", sortDir: 1, page: 0 };

  function el(tag, text, cls) {
    var e = document.createElement(tag);
    if (text !== undefined && text !== null) e.textContent = String(text);
    if (cls) e.className = cls;
    return e;
  }
  function link(href, text) { var a = el("a", text); a.href = href; return a; }
  function hex(n) { return "0x" + n.toString(16); }
  function big(hexstr) { return BigInt("0x" + hexstr); }

  var RV = window.RV = {
    meta: function (m) { state.meta = m; },
    functions: function (f) { state.fn = f; },
    shard: function (s) {
      state.shards[s.n] = s;
      var w = state.waiting[s.n] || [];
      delete state.waiting[s.n];
      w.forEach(function (cb) { cb(s); });
    }
  };

  function loadShard(n, cb) {
    if (state.shards[n]) { cb(state.shards[n]); return; }
    if (state.waiting[n]) { state.waiting[n].push(cb); return; }
    state.waiting[n] = [cb];
    var s = document.createElement("script");
    s.src = "data/s/" + n + ".js";
    s.addEventListener("error", function () { showError("cannot load shard " + n); });
    document.body.appendChild(s);
  }
  function showError(msg) {
    var fn = document.getElementById("fn");
    fn.textContent = "";
    fn.appendChild(el("p", msg, "error"));
  }

  // ---- the function table -------------------------------------------------------------
  function matcher() {
    var q = document.getElementById("f-search").value.trim();
    if (!q) return null;
    if (q.length > 2 && q[0] === "/" && q[q.length - 1] === "/") {
      try { var re = new RegExp(q.slice(1, -1), "i"); return function (s) { return re.test(s); }; }
      catch (e) { return function () { return false; }; }
    }
    q = q.toLowerCase();
    return function (s) { return s.toLowerCase().indexOf(q) >= 0; };
  }
  function refilter() {
    var f = state.fn, m = matcher();
    var has = document.getElementById("f-has").value;
    var sec = document.getElementById("f-section").value;
    var out = [];
    for (var i = 0; i < f.id.length; i++) {
      if (m && !m(f.name[i])) continue;
      if (has && !f[has][i]) continue;
      if (sec !== "" && f.section[i] !== +sec) continue;
      out.push(i);
    }
    var k = state.sortKey, d = state.sortDir;
    if (k === "name") out.sort(function (a, b) { return d * (f.name[a] < f.name[b] ? -1 : f.name[a] > f.name[b] ? 1 : 0); });
    else if (k === "start") { if (d < 0) out.reverse(); }
    else out.sort(function (a, b) { return d * (f[k][a] - f[k][b]) || a - b; });
    state.order = out;
    state.page = 0;
    drawTable();
  }
  function drawTable() {
    var f = state.fn, order = state.order, body = document.getElementById("f-body");
    var pages = Math.max(1, Math.ceil(order.length / PAGE));
    if (state.page >= pages) state.page = pages - 1;
    var frag = document.createDocumentFragment();
    var lo = state.page * PAGE, hi = Math.min(order.length, lo + PAGE);
    for (var j = lo; j < hi; j++) {
      var i = order[j], tr = el("tr");
      var td = el("td"); td.appendChild(link("#f=" + f.id[i], f.name[i])); tr.appendChild(td);
      tr.appendChild(el("td", "0x" + f.start[i], "mono"));
      tr.appendChild(el("td", f.n[i], "num"));
      ["proved", "opaque", "rejected", "unknown", "refuted"].forEach(function (v) {
        tr.appendChild(el("td", f[v][i], "num" + (f[v][i] && v !== "proved" ? " v-" + v : "")));
      });
      frag.appendChild(tr);
    }
    body.textContent = "";
    body.appendChild(frag);
    document.getElementById("f-count").textContent = order.length.toLocaleString() + " of " + f.id.length.toLocaleString() + " functions";
    document.getElementById("f-page").textContent = "page " + (state.page + 1) + " of " + pages;
  }
  function setupTable() {
    var f = state.fn, sel = document.getElementById("f-section");
    f.sections.forEach(function (s, i) { var o = el("option", s); o.value = String(i); sel.appendChild(o); });
    var timer = null;
    document.getElementById("f-search").addEventListener("input", function () {
      clearTimeout(timer); timer = setTimeout(refilter, 120);
    });
    document.getElementById("f-has").addEventListener("change", refilter);
    sel.addEventListener("change", refilter);
    document.querySelectorAll("#f-table button[data-sort]").forEach(function (b) {
      b.addEventListener("click", function () {
        var k = b.getAttribute("data-sort");
        if (state.sortKey === k) state.sortDir = -state.sortDir;
        else { state.sortKey = k; state.sortDir = (k === "name" || k === "start") ? 1 : -1; }
        refilter();
      });
    });
    document.getElementById("f-prev").addEventListener("click", function () { if (state.page > 0) { state.page--; drawTable(); } });
    document.getElementById("f-next").addEventListener("click", function () { state.page++; drawTable(); });
    refilter();
  }

  // ---- the function listing and the instruction view ---------------------------------------
  // the inverse of build.packed: base-32 digits, the last of each number from FINAL, the others from MORE
  var FINAL = "0123456789abcdefghijklmnopqrstuv", MORE = "ABCDEFGHIJKLMNOPQRSTUVWXYZ()*+-.";
  function unpack(s) {
    var out = [], v = 0;
    for (var i = 0; i < s.length; i++) {
      var c = s[i], f = FINAL.indexOf(c);
      if (f >= 0) { out.push(v * 32 + f); v = 0; } else { v = v * 32 + MORE.indexOf(c); }
    }
    return out;
  }
  function m0() { return state.meta; }
  function jumpOf(fe, i) {  // [bucket name, example reason] of instruction i, or null
    if (!state.meta.jump || !fe.j || fe.j[i] === "~") return null;
    return state.meta.jump[fe.j.charCodeAt(i) - 48];
  }
  function unpacked(fe) {
    if (!fe.D) { fe.D = unpack(fe.d); fe.O = unpack(fe.o); fe.T = unpack(fe.t); }
    return fe;
  }
  function rowsOf(fe) {
    var raw = atob(fe.b), rows = [], pos = 0, off = 0, start = big(fe.a);
    for (var i = 0; i < fe.l.length; i++) {
      if (fe.g && fe.g[i] !== undefined) off = fe.g[i];
      var n = fe.l.charCodeAt(i) - 48, h = "";
      for (var k = 0; k < n; k++) h += ("0" + raw.charCodeAt(pos + k).toString(16)).slice(-2) + " ";
      rows.push({ i: i, off: off, len: n, hex: h.trim(), addr: "0x" + (start + BigInt(off)).toString(16) });
      pos += n; off += n;
    }
    return rows;
  }
  function kv(dl, k, v, cls) {
    dl.appendChild(el("dt", k));
    var dd = el("dd", null, cls);
    if (v instanceof Node) dd.appendChild(v); else dd.textContent = v;
    dl.appendChild(dd);
  }
  function pre(text, cls) { return el("pre", text, cls); }

  function detail(s, fid, fe, r) {
    var m = state.meta, o = m.outcomes[fe.O[r.i]], x = (fe.x && fe.x[r.i]) || {};
    var box = el("div", null, "detail");
    box.id = "insn-detail";
    box.appendChild(el("h3", fe.n + "+" + hex(r.off) + " at " + r.addr));
    var dl = el("dl");
    kv(dl, "bytes", r.hex, "mono");
    kv(dl, "disassembly", s.S[fe.D[r.i]], "mono");
    kv(dl, "verdict", o[0], "v-" + o[0]);
    kv(dl, "method", o[1]);
    kv(dl, "plan", o[2] + " (rule " + o[3] + ")");
    kv(dl, "class", o[4]);
    kv(dl, "reason", x.r !== undefined ? s.S[x.r] : o[6]);
    kv(dl, "proof time", fe.T[r.i] + " µs, " + (fe.c[r.i] === "1" ? "fresh (proved in the run)" : "cached (a reused verdict)"));
    if (x.s) {
      var kinds = m.sites.filter(function (k, b) { return Math.floor(x.s / Math.pow(2, b)) % 2 === 1; });
      kv(dl, "kernel sites", kinds.join(", "));
    }
    var jb = jumpOf(fe, r.i);
    if (jb) kv(dl, "jump probe", jb[0] === "eligible" ? "eligible: the range is safe to overwrite and its block is proved"
                                 : "refused: " + jb[0] + " (for example: " + jb[1] + ")");
    kv(dl, "decoders", x.a ? pre(JSON.stringify(JSON.parse(x.a), null, 1)) : "capstone and iced-x86 agree");
    box.appendChild(dl);
    if (x.v) {
      box.appendChild(el("h4", "live variants at this boot-patched site"));
      var t = el("table", null, "variants"), hr = el("tr");
      ["variant", "verdict", "reason"].forEach(function (h) { hr.appendChild(el("th", h)); });
      t.appendChild(hr);
      x.v.forEach(function (vi) {
        var v = s.S[vi].split("\t"), tr = el("tr");
        tr.appendChild(el("td", v[0])); tr.appendChild(el("td", v[1], "v-" + v[1])); tr.appendChild(el("td", v[2]));
        t.appendChild(tr);
      });
      box.appendChild(t);
    }
    box.appendChild(el("h4", "plan, recomputed from the stored bytes"));
    if (x.p !== undefined) box.appendChild(pre(s.S[x.p[0]] + "\n" + s.S[x.p[1]], "plan"));
    else box.appendChild(el("p", m.tramp === null ? "No trampoline address is recorded for this store's run." :
      "Not recomputed: the image has more than " + m.plan_limit.toLocaleString() + " instructions, so plans are " +
      "recomputed for the instructions that are not proved only. To see it: relocverify check '" + r.hex + "' --at " +
      r.addr + " --tramp " + m.tramp));
    if (x.e) {
      var c = el("div", null, "cex");
      c.id = "cex";
      c.appendChild(el("h4", "counterexample"));
      c.appendChild(el("p", "inputs:"));
      c.appendChild(pre(JSON.stringify(x.e.state, null, 1)));
      c.appendChild(el("p", "outputs that differ (what, original, relocated):"));
      c.appendChild(pre((x.e.differences || []).map(function (d) { return d.join("  "); }).join("\n")));
      c.appendChild(el("p", "replay:"));
      c.appendChild(pre(x.e.replay || "", "replay"));
      box.appendChild(c);
    }
    return box;
  }

  function showFunction(fid, off) {
    var f = state.fn, idx = f.id.indexOf(fid), fn = document.getElementById("fn");
    if (idx < 0) { showError("no function " + fid); return; }
    fn.textContent = "";
    fn.appendChild(el("p", "loading…"));
    loadShard(f.shard[idx], function (s) {
      var fe = s.F[fid];
      fn.textContent = "";
      if (!fe) { showError("function " + fid + " is not in its shard"); return; }
      unpacked(fe);
      var h = el("h2", fe.n); h.id = "fn-name"; fn.appendChild(h);
      var counts = VERDICTS.map(function (v) { return v + " " + f[v][idx]; }).join(", ");
      fn.appendChild(el("p", "0x" + fe.a + " in " + fe.sec + ": " + f.n[idx] + " instructions; " + counts));
      var rows = rowsOf(fe), selected = null;
      rows.forEach(function (r) { if (r.off === off) selected = r; });
      if (selected) fn.appendChild(detail(s, fid, fe, selected));
      var t = el("table", null, "listing"), hr = el("tr");
      var jumps = m0().jump && fe.j;
      ["address", "offset", "bytes", "disassembly", "verdict", "reason"].concat(jumps ? ["jump probe"] : [])
        .forEach(function (x) { hr.appendChild(el("th", x)); });
      var thead = el("thead"); thead.appendChild(hr); t.appendChild(thead);
      var body = el("tbody"), frag = document.createDocumentFragment(), m = state.meta;
      rows.forEach(function (r) {
        var o = m.outcomes[fe.O[r.i]], x = (fe.x && fe.x[r.i]) || {};
        var tr = el("tr", null, r === selected ? "selected" : "");
        var a = el("td", null, "mono"); a.appendChild(link("#i=" + fid + ":" + r.off, r.addr)); tr.appendChild(a);
        tr.appendChild(el("td", "+" + hex(r.off), "mono"));
        tr.appendChild(el("td", r.hex, "mono bytes"));
        tr.appendChild(el("td", s.S[fe.D[r.i]], "mono"));
        tr.appendChild(el("td", o[0] + (x.e ? " (counterexample)" : ""), "v-" + o[0]));
        tr.appendChild(el("td", o[0] === "proved" ? o[1] : (x.r !== undefined ? s.S[x.r] : o[6]), "reason"));
        if (jumps) {
          var jb = jumpOf(fe, r.i), td = el("td", jb ? jb[0] : "not analysed", jb && jb[0] === "eligible" ? "v-proved" : "jump");
          if (jb) td.title = jb[1];
          tr.appendChild(td);
        }
        frag.appendChild(tr);
      });
      body.appendChild(frag); t.appendChild(body); fn.appendChild(t);
      if (selected) document.getElementById("insn-detail").scrollIntoView();
      else window.scrollTo(0, 0);
    });
  }

  // ---- routing ------------------------------------------------------------------------
  function show(view) {
    document.querySelectorAll(".view").forEach(function (v) { v.hidden = v.id !== "view-" + view; });
  }
  function route() {
    var h = location.hash.slice(1), m;
    if ((m = /^f=(\d+)$/.exec(h))) { show("function"); showFunction(+m[1], null); }
    else if ((m = /^i=(\d+):(\d+)$/.exec(h))) { show("function"); showFunction(+m[1], +m[2]); }
    else if (h === "functions") { show("functions"); }
    else if (h === "baseline" && document.getElementById("view-baseline")) { show("baseline"); }
    else { show("summary"); }
  }
  document.addEventListener("DOMContentLoaded", function () {
    if (!state.fn || !state.meta) { document.body.appendChild(el("p", "report data missing (data/*.js)", "error")); return; }
    setupTable();
    window.addEventListener("hashchange", route);
    route();
    document.body.setAttribute("data-ready", "1");
  });
})();
