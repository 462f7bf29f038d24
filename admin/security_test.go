package admin

import (
	"context"
	"errors"
	"html"
	"net/http"
	"net/http/httptest"
	"net/url"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/inproc/broker"
)

const (
	xssScript = `<script>alert(1)</script>`
	xssImg    = `<img src=x onerror=alert(1)>`
	xssAttr   = `"><script>alert(2)</script>`
)

// TestMarkupRendersAsText: a message whose ID, topic, subscriber, key,
// headers, error and payload hold markup renders escaped in every page and
// JSON body.
func TestMarkupRendersAsText(t *testing.T) {
	b := newBroker(t)
	h := newHandler(t, b, Options{AllowActions: true})
	_, err := b.Subscribe(xssImg, xssAttr, func(context.Context, broker.Message) error {
		return broker.Permanent(errors.New(xssScript))
	})
	require.NoError(t, err)
	publish(t, b, broker.Message{ID: xssScript, Topic: xssImg, Key: xssAttr,
		Headers: map[string]string{xssScript: xssImg, "x-attr": xssAttr},
		Payload: []byte(xssScript + xssImg)})
	waitDeadLetters(t, b, 1)
	id := listIDs(t, b, broker.DeadLetterFilter{})[0]

	htmlPages := []string{
		"/",
		"/deadletters",
		"/deadletters?topic=" + url.QueryEscape(xssImg) + "&subscriber=" + url.QueryEscape(xssAttr) + "&code=" + url.QueryEscape(xssScript) + "&reason=" + url.QueryEscape(xssAttr),
		"/deadletters/" + pathEscape(id),
		"/deadletters/" + pathEscape(xssScript),            // 404 page naming the ID
		"/deadletters?limit=" + url.QueryEscape(xssScript), // 400 page quoting the input
	}
	for _, p := range htmlPages {
		t.Run("html "+p, func(t *testing.T) {
			page := get(h, p).Body.String()
			for _, raw := range []string{"<script>alert", "<img src=x", `"><script>`} {
				assert.NotContains(t, page, raw)
			}
			assert.Contains(t, page, "&lt;script&gt;alert(")
		})
	}
	detail := getOK(t, h, "/deadletters/"+pathEscape(id))
	for _, escaped := range []string{
		"&lt;script&gt;alert(1)&lt;/script&gt;",                  // message ID, header name, error, payload
		"&lt;img src=x onerror=alert(1)&gt;",                     // topic, header value
		"&#34;&gt;&lt;script&gt;alert(2)&lt;/script&gt;",         // subscriber, key
		`data-header="&lt;script&gt;alert(1)&lt;/script&gt;"`,    // in an attribute
		`value="&#34;&gt;&lt;script&gt;alert(2)&lt;/script&gt;"`, // the form's hidden subscriber
	} {
		assert.Contains(t, detail, escaped)
	}
	overview := getOK(t, h, "/")
	assert.Contains(t, overview, `data-topic="&lt;img src=x onerror=alert(1)&gt;"`)
	assert.Contains(t, overview, `data-subscriber="&#34;&gt;&lt;script&gt;alert(2)&lt;/script&gt;"`)
	// Query values in links are percent-encoded.
	assert.Contains(t, overview, `href="deadletters?topic=%3cimg%20src%3dx%20onerror%3dalert%281%29%3e&amp;subscriber=%22%3e%3cscript%3ealert%282%29%3c%2fscript%3e"`)

	for _, p := range []string{"/api/stats", "/api/deadletters", "/api/deadletters/" + pathEscape(id), "/api/deadletters/" + pathEscape(xssScript)} {
		t.Run("json "+p, func(t *testing.T) {
			body := get(h, p).Body.String()
			assert.NotContains(t, body, "<script>")
			assert.NotContains(t, body, "<img")
			assert.Contains(t, body, `\u003cscript\u003ealert(`)
		})
	}
	var d DeadLetterDetail
	getJSON(t, h, "/api/deadletters/"+pathEscape(id), &d)
	assert.Equal(t, xssScript, d.MessageID, "escaped on the wire, intact when decoded")
	assert.Equal(t, xssImg, d.Topic)
	assert.Equal(t, xssImg, d.Headers[xssScript])
}

var linkRe = regexp.MustCompile(`\s(href|src|action|formaction)="([^"]*)"`)

// links returns every link of a page, unescaped.
func links(page string) []string {
	var out []string
	for _, m := range linkRe.FindAllStringSubmatch(page, -1) {
		out = append(out, html.UnescapeString(m[2]))
	}
	return out
}

// TestIDsInURLs: dead-letter IDs holding '/', '?', '#', spaces, '%', dots
// and markup are percent-encoded in links, and each link leads to its dead
// letter, under a prefix too.
func TestIDsInURLs(t *testing.T) {
	b := newBroker(t)
	h := newHandler(t, b, Options{AllowActions: true})
	mux := http.NewServeMux()
	mux.Handle("/admin/", http.StripPrefix("/admin", h))

	ids := []string{"a/b", "../../etc", "q?x=1&y=2", "h#frag", "sp ace", "100%", "a%2Fb", ".", "..",
		"javascript:alert(1)", xssScript, "ünïcödé", "tab\there"}
	ctx := context.Background()
	for _, id := range ids {
		require.NoError(t, b.DeadLetters().Put(ctx, broker.DeadLetter{ID: id, Subscriber: "s", Reason: "permanent",
			FailedAt: time.Now(), Message: broker.Message{ID: "m", Topic: "t"}}))
	}
	base, _ := url.Parse("http://example.com/admin/deadletters")
	list := getOK(t, mux, base.String())
	seen := map[string]bool{}
	for _, l := range links(list) {
		if !strings.HasPrefix(l, "deadletters/") {
			continue
		}
		u, err := base.Parse(l)
		require.NoError(t, err)
		require.True(t, strings.HasPrefix(u.EscapedPath(), "/admin/deadletters/"), "%q left the page's folder: %s", l, u)
		page := getOK(t, mux, u.String())
		got := html.UnescapeString(between(page, `<code id="dl-id">`, "</code>"))
		got = strings.TrimSuffix(strings.TrimPrefix(got, `<code id="dl-id">`), "</code>")
		seen[got] = true

		api, err := u.Parse("../api/deadletters/" + strings.TrimPrefix(l, "deadletters/"))
		require.NoError(t, err)
		var d DeadLetterDetail
		getJSON(t, mux, api.String(), &d)
		assert.Equal(t, got, d.ID)
	}
	for _, id := range ids {
		assert.True(t, seen[id], "no working link to %q", id)
	}

	// Deleting by the form's value works for every one of them.
	s := formSession(t, mux, base.String())
	w := do(mux, s.postForm("/admin/delete", url.Values{"id": ids}))
	require.Equal(t, http.StatusSeeOther, w.Code)
	waitDeadLetters(t, b, 0)
}

func TestSecurityHeaders(t *testing.T) {
	b := failingBroker(t)
	h := newHandler(t, b, Options{AllowActions: true})
	id := listIDs(t, b, broker.DeadLetterFilter{})[0]
	for _, p := range []string{"/", "/deadletters", "/deadletters/" + pathEscape(id), "/deadletters/nope", "/api/stats",
		"/api/deadletters", "/api/deadletters/" + pathEscape(id), "/api/token", "/static/app.js", "/static/app.css", "/nowhere", "/redrive"} {
		t.Run(p, func(t *testing.T) {
			hd := get(h, p).Header()
			assert.Equal(t, "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; connect-src 'self'; "+
				"form-action 'self'; base-uri 'none'; frame-ancestors 'none'", hd.Get("Content-Security-Policy"))
			assert.Equal(t, "nosniff", hd.Get("X-Content-Type-Options"))
			assert.Equal(t, "no-referrer", hd.Get("Referrer-Policy"))
			assert.Equal(t, "DENY", hd.Get("X-Frame-Options"))
			if !strings.HasPrefix(p, "/static/") && p != "/redrive" { // GET /redrive: the mux's 405
				assert.Equal(t, "no-store", hd.Get("Cache-Control"))
			}
		})
	}
	// No inline script or style anywhere: the CSP would block it.
	for _, p := range []string{"/", "/deadletters", "/deadletters/" + pathEscape(id)} {
		page := getOK(t, h, p)
		assert.Equal(t, 1, strings.Count(page, "<script"), p)
		assert.Contains(t, page, `<script src="`, p)
		assert.NotContains(t, page, "<style", p)
		assert.NotContains(t, page, "style=", p)
		assert.NotRegexp(t, ` on[a-z]+=`, page, p)
	}
}

func TestStaticAssets(t *testing.T) {
	b := newBroker(t)
	h := newHandler(t, b, Options{})
	for name, ctype := range map[string]string{"app.js": "text/javascript; charset=utf-8", "app.css": "text/css; charset=utf-8"} {
		w := get(h, "/static/"+name)
		require.Equal(t, http.StatusOK, w.Code)
		assert.Equal(t, ctype, w.Header().Get("Content-Type"))
		etag := w.Header().Get("ETag")
		require.NotEmpty(t, etag)
		req, _ := http.NewRequest(http.MethodGet, "/static/"+name, nil)
		req.Header.Set("If-None-Match", etag)
		assert.Equal(t, http.StatusNotModified, do(h, req).Code)
	}
	for _, p := range []string{"/static/", "/static/nope.js", "/static/../admin.go", "/templates/layout.html"} {
		assert.NotEqual(t, http.StatusOK, get(h, p).Code, p)
	}
}

// TestUnknownPaths: a path the handler has no route for gets its own error
// page (JSON under api/), 404 and no-store, not the mux's plain text; a
// known path asked with the wrong method still gets 405 with Allow.
func TestUnknownPaths(t *testing.T) {
	h := newHandler(t, failingBroker(t), Options{})
	tests := []struct {
		method, path string
		status       int
		contentType  string
		body         string // in the body
	}{
		{http.MethodGet, "/nope", http.StatusNotFound, "text/html", `data-page="error"`},
		{http.MethodGet, "/deadletters/", http.StatusNotFound, "text/html", `href="../static/app.css"`},
		{http.MethodGet, "/deadletters/a%2Fb", http.StatusNotFound, "text/html", `href="../static/app.css"`}, // an unknown ID with a slash
		{http.MethodGet, "/a/b/c", http.StatusNotFound, "text/html", `href="../../static/app.css"`},
		{http.MethodPost, "/nope", http.StatusNotFound, "text/html", "no such page: /nope"},
		{http.MethodGet, "/api/nope", http.StatusNotFound, "application/json", `"error":"admin: no such page: /api/nope"`},
		{http.MethodPost, "/deadletters", http.StatusMethodNotAllowed, "text/plain", "Method Not Allowed"},
		{http.MethodGet, "/api/redrive", http.StatusMethodNotAllowed, "text/plain", "Method Not Allowed"},
	}
	for _, tt := range tests {
		t.Run(tt.method+" "+tt.path, func(t *testing.T) {
			w := do(h, httptest.NewRequest(tt.method, tt.path, nil))
			assert.Equal(t, tt.status, w.Code)
			assert.True(t, strings.HasPrefix(w.Header().Get("Content-Type"), tt.contentType), w.Header().Get("Content-Type"))
			assert.Contains(t, w.Body.String(), tt.body)
			if tt.status == http.StatusNotFound {
				assert.Equal(t, "no-store", w.Header().Get("Cache-Control"))
			} else {
				assert.NotEmpty(t, w.Header().Get("Allow"))
			}
		})
	}
}

// TestMounts: mounted at the root or under a prefix (with or without the
// prefix's trailing slash stripped), every link of every page leads to a
// page of the handler, and actions redirect back under the prefix.
func TestMounts(t *testing.T) {
	tests := []struct {
		name  string
		base  string
		mount func(h http.Handler) http.Handler
	}{
		{"root", "/", func(h http.Handler) http.Handler { return h }},
		{"StripPrefix /admin", "/admin/", func(h http.Handler) http.Handler {
			m := http.NewServeMux()
			m.Handle("/admin/", http.StripPrefix("/admin", h))
			return m
		}},
		{"StripPrefix /ops/admin/", "/ops/admin/", func(h http.Handler) http.Handler {
			m := http.NewServeMux()
			m.Handle("/ops/admin/", http.StripPrefix("/ops/admin/", h))
			return m
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			b := failingBroker(t)
			h := newHandler(t, b, Options{AllowActions: true, PageSize: 2})
			srv := tt.mount(h)
			start, _ := url.Parse("http://example.com" + tt.base)

			// Crawl every page reachable from the overview.
			visited := map[string]bool{}
			queue := []*url.URL{start}
			var forms []*url.URL
			for len(queue) > 0 && len(visited) < 80 {
				u := queue[0]
				queue = queue[1:]
				if visited[u.String()] {
					continue
				}
				visited[u.String()] = true
				w := get(srv, u.String())
				require.Equal(t, http.StatusOK, w.Code, "GET %s", u)
				if !strings.HasPrefix(w.Header().Get("Content-Type"), "text/html") {
					continue
				}
				page := w.Body.String()
				for _, m := range linkRe.FindAllStringSubmatch(page, -1) {
					next, err := u.Parse(html.UnescapeString(m[2]))
					require.NoError(t, err)
					require.True(t, strings.HasPrefix(next.Path, tt.base), "%s links to %s outside %s", u, next, tt.base)
					if m[1] == "action" || m[1] == "formaction" {
						if !strings.Contains(u.Path, "/deadletters") || strings.HasSuffix(next.Path, "/deadletters") {
							continue // the filter form (GET)
						}
						forms = append(forms, next)
						continue
					}
					queue = append(queue, next)
				}
			}
			for _, want := range []string{"", "deadletters", "api/stats", "static/app.js", "static/app.css", "api/deadletters"} {
				u, _ := start.Parse(want)
				assert.True(t, visited[u.String()], "%s not reached", u)
			}
			assert.Greater(t, len(visited), 12, "a detail page per dead letter, pages of the list")
			for _, f := range forms {
				assert.Contains(t, []string{tt.base + "redrive", tt.base + "delete", tt.base + "redrive-matching", tt.base + "delete-matching"}, f.Path)
			}

			// An action: the cookie is scoped to the mount, the redirect
			// resolves to the list under it.
			s := formSession(t, srv, start.String()+"deadletters")
			assert.Equal(t, tt.base, s.cookie.Path)
			id := listIDs(t, b, broker.DeadLetterFilter{})[0]
			del, _ := start.Parse("delete")
			w := do(srv, s.postForm(del.String(), url.Values{"id": {id}}))
			require.Equal(t, http.StatusSeeOther, w.Code, w.Body.String())
			back, err := del.Parse(w.Header().Get("Location"))
			require.NoError(t, err)
			assert.Equal(t, tt.base+"deadletters", back.Path)
			assert.Contains(t, getOK(t, srv, back.String()), "Deleted 1 dead letter.")
		})
	}
}
