// broker admin: progressive enhancement. Every page works without this
// file; with it, the overview refreshes in place from api/stats, "select
// all" is a checkbox, and destructive buttons ask first.
(function () {
  'use strict';
  // neutral shows each bidirectional control character (U+202A-U+202E,
  // U+2066-U+2069, U+200E, U+200F, U+061C) as its code point, as the
  // server's pages do: one would reorder the text after it.
  function neutral(s) {
    return s.replace(/[\u202A-\u202E\u2066-\u2069\u200E\u200F\u061C]/g, function (c) {
      return '[U+' + c.charCodeAt(0).toString(16).toUpperCase().padStart(4, '0') + ']';
    });
  }

  // Buttons with data-confirm ask before they submit.
  document.addEventListener('click', function (e) {
    var b = e.target.closest('button[data-confirm]');
    if (b && !window.confirm(b.getAttribute('data-confirm'))) {
      e.preventDefault();
    }
  });

  // "Select all on this page": a checkbox instead of the link.
  var all = document.getElementById('select-all');
  if (all) {
    var boxes = document.querySelectorAll('input[type=checkbox][name=id]');
    var link = document.getElementById('select-all-link');
    if (link) { link.hidden = true; }
    all.hidden = false;
    all.addEventListener('change', function () {
      boxes.forEach(function (c) { c.checked = all.checked; });
    });
  }

  var body = document.body;
  if (body.getAttribute('data-page') !== 'overview') { return; }
  var every = parseInt(body.getAttribute('data-refresh-ms'), 10) || 2000;

  // Formats: keep them alike the Go functions in pages.go.
  function pad(n) { return (n < 10 ? '0' : '') + n; }
  function age(sec) {
    if (!(sec > 0)) { return '0'; }
    if (sec < 1) { return Math.round(sec * 1000) + 'ms'; }
    if (sec < 60) { return sec.toFixed(1) + 's'; }
    var s = Math.floor(sec);
    if (sec < 3600) { return Math.floor(s / 60) + 'm' + pad(s % 60) + 's'; }
    var m = Math.floor(s / 60);
    return Math.floor(m / 60) + 'h' + pad(m % 60) + 'm';
  }
  function clock(iso) {
    var d = new Date(iso);
    return pad(d.getUTCHours()) + ':' + pad(d.getUTCMinutes()) + ':' + pad(d.getUTCSeconds()) + 'Z';
  }
  function fmt(v, f) {
    switch (f) {
      case 'age': return age(v);
      case 'rate': return v == null ? '\u2013' : v.toFixed(1) + '/s';
      case 'pct': return (v * 100).toFixed(1) + '%';
      case 'budget': return v < 0 ? '\u2013' : String(v);
      case 'count': return String(v ? v.length : 0);
      case 'clock': return clock(v);
      case 'breaker':
      case 'text': return v ? neutral(String(v)) : '\u2013';
      default: return String(v);
    }
  }
  function get(obj, path) {
    return path.split('.').reduce(function (o, k) { return o == null ? undefined : o[k]; }, obj);
  }
  // fill writes the values of obj into the [data-field] elements of root
  // (not those of nested rows, which fill themselves).
  function fill(root, obj) {
    root.querySelectorAll('[data-field]').forEach(function (el) {
      var row = el.closest('[data-subscriber]');
      if (row && row !== root) { return; }
      var v = get(obj, el.getAttribute('data-field'));
      if (v === undefined) { return; }
      var f = el.getAttribute('data-format');
      el.textContent = fmt(v, f);
      if (el.getAttribute('data-warn') === 'nonzero') {
        el.classList.toggle('warn', !!v && v !== 0);
      }
      if (f === 'breaker') {
        el.className = 'breaker breaker-' + (v || 'none');
      }
    });
  }

  function names(list) { return list.map(function (x) { return x.name; }).join('\u0000'); }

  function update(snap) {
    var live = snap.topics.filter(function (t) { return t.live; });
    var sections = Array.prototype.slice.call(document.querySelectorAll('section.topic[data-topic]'));
    var onPage = sections.map(function (s) { return s.getAttribute('data-topic'); }).join('\u0000');
    if (onPage !== names(live)) { window.location.reload(); return; }
    fill(document.getElementById('summary'), snap);
    for (var i = 0; i < live.length; i++) {
      var t = live[i], sec = sections[i], subs = t.subscribers;
      var rows = Array.prototype.slice.call(sec.querySelectorAll('tr[data-subscriber]'));
      var shape = rows.map(function (r) { return r.getAttribute('data-subscriber') + '/' + r.getAttribute('data-active'); }).join('\u0000');
      var want = subs.map(function (s) { return s.name + '/' + s.active; }).join('\u0000');
      if (shape !== want) { window.location.reload(); return; }
      fill(sec.querySelector('.topic-head'), t);
      var line = sec.querySelector('polyline[data-chart]');
      if (line) { line.setAttribute('points', t.chart.points); }
      for (var j = 0; j < rows.length; j++) { fill(rows[j], subs[j]); }
    }
  }

  var stamp = document.getElementById('sampled-at');
  function tick() {
    if (document.hidden) { setTimeout(tick, every); return; }
    fetch('api/stats', { headers: { 'Accept': 'application/json' }, cache: 'no-store', credentials: 'same-origin' })
      .then(function (r) {
        if (!r.ok) { throw new Error('HTTP ' + r.status); }
        return r.json();
      })
      .then(function (snap) {
        update(snap);
        if (stamp) { stamp.classList.remove('stale'); stamp.removeAttribute('title'); }
      })
      .catch(function (err) {
        if (stamp) { stamp.classList.add('stale'); stamp.title = 'refresh failed: ' + err.message; }
      })
      .then(function () { setTimeout(tick, every); });
  }
  setTimeout(tick, every);
})();
