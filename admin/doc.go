// Package admin is an admin page for a broker.Broker: an http.Handler,
// server-rendered with html/template from embedded templates and assets (no
// build step, no CDN, no JavaScript library), that shows what an on-call
// engineer needs at a glance and lets them act on dead letters.
//
// Mount it anywhere, at the root or under a prefix with http.StripPrefix:
//
//	h, err := admin.New(b, admin.Options{AllowActions: true})
//	if err != nil { ... }
//	defer h.Close()
//	mux.Handle("/admin/", http.StripPrefix("/admin", h))
//
// Every link the pages contain is relative, so the prefix needs no
// configuration. Put your own authentication in front of it: the handler
// has none.
//
// # Pages
//
//   - The overview (the mount point itself) lists every live topic with its
//     queue and subscribers from Broker.Stats: backlog, in flight, oldest
//     age, delivery and publish rates, retries, dead letters, breaker state,
//     lane capacity and the time the subscriber blocked its topic, with a
//     backlog-over-time chart per topic (inline SVG drawn on the server).
//     Retired topics (no subscriber, nothing queued) follow in a compact
//     table. The page refreshes itself: a small embedded script polls
//     api/stats, and without JavaScript a meta refresh reloads it.
//   - deadletters lists dead letters, filtered by topic, subscriber, error
//     code, reason, message ID and failure time, a page at a time, newest
//     first (through broker.ListNewest, which reads a
//     broker.DeadLetterLister store from its newest end) or oldest first.
//     With actions on it also offers redrive and delete of every dead
//     letter matching the filter, the confirmation naming how many.
//   - deadletters/{id} shows one: headers, error, attempts, reason, times
//     and the payload, as text when it is printable UTF-8 and as a hex dump
//     otherwise, at most Options.PayloadLimit bytes of it.
//
// The same data is served as JSON for scripts: GET api/stats (Snapshot),
// GET api/deadletters (DeadLetterList, same query parameters as the page),
// GET api/deadletters/{id} (DeadLetterDetail), and, when actions are
// allowed, GET api/token, POST api/redrive and POST api/delete
// (ActionRequest in, ActionResult out).
//
// # Rates and charts
//
// Rates (messages per second) are the difference of two samples of Stats
// over the time between them. The handler samples Stats when the overview or
// api/stats is requested, at most once per Options.SampleInterval, so it
// starts no goroutine; with Options.SampleInBackground it samples every
// SampleInterval from a goroutine of its own, which Handler.Close ends. Each
// live topic keeps its last Options.History samples for its chart; the
// samples and counters of a topic that is no longer live are dropped at the
// next sample, so the handler's memory follows what is live.
//
// # Actions and cross-site requests
//
// Redrive (Broker.Redrive) and delete (DeadLetterStore.Delete) are off
// unless Options.AllowActions is set: while they are off, the pages show no
// buttons and every action request gets 403 Forbidden. Actions are POST only (405
// otherwise) and refused (403) when the request is cross-site: a
// Sec-Fetch-Site other than same-origin or none (http.CrossOriginProtection),
// an Origin header whose host is not the request's Host (unless listed in
// Options.TrustedOrigins), or a missing or wrong CSRF token. The token is
// an HMAC, under a random key of the handler, of a random value kept in a
// cookie (a signed double-submit cookie): pages embed it in their forms, and
// scripts get it, with the cookie, from GET api/token and send it in the
// X-CSRF-Token header.
//
// # Escaping and headers
//
// Every value (topic, subscriber, IDs, headers, errors, payloads) is
// escaped by html/template or encoding/json; IDs in URLs are
// percent-encoded. What a page shows of a user-controlled string is
// bounded (FieldLimit, ListErrorLimit, PayloadLimit) and has its
// bidirectional control characters written as code points ([U+202E]), so
// that no value can widen the page or reorder the text around it. Every response carries a Content-Security-Policy that
// allows only the embedded script and style (no inline script), with
// frame-ancestors 'none', X-Frame-Options DENY, X-Content-Type-Options
// nosniff and Referrer-Policy no-referrer; pages and JSON are not cached.
package admin
