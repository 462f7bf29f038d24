package admin

import (
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/inproc/broker"
)

// redrivable returns a broker whose subscriber orders/mailer failed msgs
// once (they are dead letters) and will deliver them from now on, to
// delivered.
func redrivable(t *testing.T, msgs ...string) (*broker.Broker, <-chan string) {
	t.Helper()
	b := newBroker(t)
	var healthy atomic.Bool
	delivered := make(chan string, len(msgs))
	_, err := b.Subscribe("orders", "mailer", func(ctx context.Context, m broker.Message) error {
		if !healthy.Load() {
			return broker.Permanent(errors.New("mail server down"))
		}
		delivered <- m.ID
		return nil
	})
	require.NoError(t, err)
	for _, id := range msgs {
		publish(t, b, broker.Message{ID: id, Topic: "orders"})
	}
	waitDeadLetters(t, b, len(msgs))
	healthy.Store(true)
	return b, delivered
}

func receive(t *testing.T, c <-chan string) string {
	t.Helper()
	select {
	case id := <-c:
		return id
	case <-time.After(10 * time.Second):
		t.Fatal("nothing delivered")
		return ""
	}
}

// TestRedriveFromThePage: the form redrives the dead letter to its
// subscriber, which gets it; the dead letter is gone and the list says so.
func TestRedriveFromThePage(t *testing.T) {
	b, delivered := redrivable(t, "m-1")
	h := newHandler(t, b, Options{AllowActions: true})
	id := listIDs(t, b, broker.DeadLetterFilter{})[0]

	s := formSession(t, h, "/deadletters?topic=orders")
	w := do(h, s.postForm("/redrive", url.Values{"id": {id}, "topic": {"orders"}}))
	require.Equal(t, http.StatusSeeOther, w.Code, w.Body.String())
	loc := w.Header().Get("Location")
	assert.Equal(t, "deadletters?done=redrive&ok=1&topic=orders", loc)

	assert.Equal(t, "m-1", receive(t, delivered))
	waitDeadLetters(t, b, 0)
	page := getOK(t, h, "/"+loc)
	assert.Contains(t, page, `id="notice"`)
	assert.Contains(t, page, "Redrove 1 dead letter.")
	assert.Contains(t, page, "No dead letters match.")
}

func TestRedriveFromTheDetailPage(t *testing.T) {
	b, delivered := redrivable(t, "m-1")
	h := newHandler(t, b, Options{AllowActions: true})
	id := listIDs(t, b, broker.DeadLetterFilter{})[0]
	s := formSession(t, h, "/deadletters/"+pathEscape(id))
	page := getOK(t, h, "/deadletters/"+pathEscape(id))
	assert.Contains(t, page, `<form id="actions-form" class="actions" method="post" action="../redrive">`)
	assert.Contains(t, page, `<input type="hidden" name="id" value="`+id+`">`)
	w := do(h, s.postForm("/redrive", url.Values{"id": {id}, "topic": {"orders"}, "subscriber": {"mailer"}}))
	require.Equal(t, http.StatusSeeOther, w.Code)
	assert.Equal(t, "m-1", receive(t, delivered))
	waitDeadLetters(t, b, 0)
}

// TestRedriveAPI: a script redrives with the token from api/token; each ID
// that fails says why.
func TestRedriveAPI(t *testing.T) {
	b, delivered := redrivable(t, "m-1", "m-2")
	h := newHandler(t, b, Options{AllowActions: true})
	ids := listIDs(t, b, broker.DeadLetterFilter{})
	s := apiSession(t, h, "")

	w := do(h, s.postJSON("/api/redrive", ids[0], "nope", ids[0], ""))
	require.Equal(t, http.StatusOK, w.Code, w.Body.String())
	var res ActionResult
	decodeStrict(t, w.Body, &res)
	assert.Equal(t, "redrive", res.Action)
	assert.Equal(t, []string{ids[0]}, res.Done, "repeated and empty IDs are dropped")
	require.Len(t, res.Failed, 1)
	assert.Equal(t, "nope", res.Failed[0].ID)
	assert.Equal(t, "not_found", res.Failed[0].Code)
	assert.Contains(t, res.Failed[0].Error, "not found")
	assert.Equal(t, "m-1", receive(t, delivered))
	waitDeadLetters(t, b, 1)
}

// TestRedriveToAGoneSubscriberFails keeps the dead letter and says why.
func TestRedriveToAGoneSubscriberFails(t *testing.T) {
	b := newBroker(t)
	h := newHandler(t, b, Options{AllowActions: true})
	sub, err := b.Subscribe("orders", "mailer", bad)
	require.NoError(t, err)
	publish(t, b, broker.Message{ID: "m-1", Topic: "orders"})
	waitDeadLetters(t, b, 1)
	require.NoError(t, sub.Unsubscribe(context.Background()))
	id := listIDs(t, b, broker.DeadLetterFilter{})[0]

	s := formSession(t, h, "/deadletters")
	w := do(h, s.postForm("/redrive", url.Values{"id": {id}}))
	require.Equal(t, http.StatusSeeOther, w.Code)
	loc := w.Header().Get("Location")
	assert.Equal(t, "deadletters?done=redrive&failed=1&ok=0&why=no_subscriber", loc)
	page := getOK(t, h, "/"+loc)
	assert.Contains(t, page, "Redrove 0 dead letters. 1 failed: the subscriber that failed it is no longer subscribed.")
	assert.Contains(t, page, `class="notice notice-bad"`)
	waitDeadLetters(t, b, 1)
}

func TestDelete(t *testing.T) {
	b := failingBroker(t) // 5 dead letters
	h := newHandler(t, b, Options{AllowActions: true})
	ids := listIDs(t, b, broker.DeadLetterFilter{Topic: "orders", Subscriber: "flaky"})
	require.Len(t, ids, 2)

	s := formSession(t, h, "/deadletters")
	w := do(h, s.postForm("/delete", url.Values{"id": ids, "topic": {"orders"}, "subscriber": {"flaky"}}))
	require.Equal(t, http.StatusSeeOther, w.Code)
	assert.Equal(t, "deadletters?done=delete&ok=2&subscriber=flaky&topic=orders", w.Header().Get("Location"))
	assert.Empty(t, listIDs(t, b, broker.DeadLetterFilter{Subscriber: "flaky"}))
	waitDeadLetters(t, b, 3)
	assert.Contains(t, getOK(t, h, "/"+w.Header().Get("Location")), "Deleted 2 dead letters.")

	rest := listIDs(t, b, broker.DeadLetterFilter{Topic: "payments"})
	as := apiSession(t, h, "")
	w = do(h, as.postJSON("/api/delete", rest[0], ids[0]))
	require.Equal(t, http.StatusOK, w.Code)
	var res ActionResult
	decodeStrict(t, w.Body, &res)
	require.Len(t, res.Failed, 1, "%+v", res)
	assert.Equal(t, ActionResult{Action: "delete", Done: []string{rest[0]},
		Failed: []ActionFailure{{ID: ids[0], Code: "not_found", Error: res.Failed[0].Error}}}, res)
	waitDeadLetters(t, b, 2)

	w = do(h, s.postForm("/delete", url.Values{}))
	assert.Equal(t, "deadletters?done=delete&ok=0", w.Header().Get("Location"))
	assert.Contains(t, getOK(t, h, "/"+w.Header().Get("Location")), "Nothing selected.")
}

// TestActionsRefused: every way an action request can be refused, and the
// dead letter it named stays where it was; the controls show the same
// requests pass when nothing is wrong.
func TestActionsRefused(t *testing.T) {
	b := failingBroker(t)
	on := newHandler(t, b, Options{AllowActions: true, TrustedOrigins: []string{"https://ops.example.com"}})
	off := newHandler(t, b, Options{})
	other := newHandler(t, b, Options{AllowActions: true})
	id := listIDs(t, b, broker.DeadLetterFilter{})[0]
	form := formSession(t, on, "/deadletters")
	script := apiSession(t, on, "")
	stranger := formSession(t, other, "/deadletters") // valid elsewhere
	ids := func(id string) url.Values { return url.Values{"id": {id}} }

	tests := []struct {
		name string
		h    *Handler
		req  func() *http.Request
		want int
	}{
		// Controls: these pass (they name an unknown ID: nothing changes).
		{"control: same-origin form", on, func() *http.Request { return form.postForm("/delete", ids("nope")) }, http.StatusSeeOther},
		{"control: script without fetch metadata", on, func() *http.Request { return script.postJSON("/api/delete", "nope") }, http.StatusOK},
		{"control: Sec-Fetch-Site none", on, func() *http.Request {
			r := form.postForm("/delete", ids("nope"))
			r.Header.Set("Sec-Fetch-Site", "none")
			r.Header.Del("Origin")
			return r
		}, http.StatusSeeOther},
		{"control: Origin null from the page itself (Referrer-Policy: no-referrer)", on, func() *http.Request {
			r := form.postForm("/delete", ids("nope"))
			r.Header.Set("Sec-Fetch-Site", "same-origin")
			r.Header.Set("Origin", "null")
			return r
		}, http.StatusSeeOther},
		{"control: trusted origin", on, func() *http.Request {
			r := form.postForm("/delete", ids("nope"))
			r.Header.Set("Sec-Fetch-Site", "cross-site")
			r.Header.Set("Origin", "https://ops.example.com")
			return r
		}, http.StatusSeeOther},

		// Actions off.
		{"off: form", off, func() *http.Request { return form.postForm("/delete", ids(id)) }, http.StatusForbidden},
		{"off: api", off, func() *http.Request { return script.postJSON("/api/delete", id) }, http.StatusForbidden},
		{"off: token", off, func() *http.Request { return httptest.NewRequest("GET", "/api/token", nil) }, http.StatusForbidden},
		{"off: GET form endpoint", off, func() *http.Request { return httptest.NewRequest("GET", "/delete?id="+url.QueryEscape(id), nil) }, http.StatusMethodNotAllowed},

		// Methods.
		{"GET form endpoint", on, func() *http.Request { return httptest.NewRequest("GET", "/redrive?id="+url.QueryEscape(id), nil) }, http.StatusMethodNotAllowed},
		{"GET api endpoint", on, func() *http.Request { return httptest.NewRequest("GET", "/api/delete", nil) }, http.StatusMethodNotAllowed},
		{"PUT api endpoint", on, func() *http.Request {
			r := script.postJSON("/api/delete", id)
			r.Method = http.MethodPut
			return r
		}, http.StatusMethodNotAllowed},

		// Cross-site.
		{"Sec-Fetch-Site cross-site", on, func() *http.Request {
			r := form.postForm("/delete", ids(id))
			r.Header.Set("Sec-Fetch-Site", "cross-site")
			return r
		}, http.StatusForbidden},
		{"Sec-Fetch-Site same-site", on, func() *http.Request {
			r := form.postForm("/delete", ids(id))
			r.Header.Set("Sec-Fetch-Site", "same-site")
			return r
		}, http.StatusForbidden},
		{"api: Sec-Fetch-Site cross-site", on, func() *http.Request {
			r := script.postJSON("/api/delete", id)
			r.Header.Set("Sec-Fetch-Site", "cross-site")
			return r
		}, http.StatusForbidden},
		{"Origin of another host", on, func() *http.Request {
			r := form.postForm("/delete", ids(id))
			r.Header.Del("Sec-Fetch-Site")
			r.Header.Set("Origin", "http://evil.example")
			return r
		}, http.StatusForbidden},
		{"Origin of another host with same-origin fetch site", on, func() *http.Request {
			r := form.postForm("/delete", ids(id))
			r.Header.Set("Origin", "http://evil.example")
			return r
		}, http.StatusForbidden},
		{"Origin null without fetch metadata", on, func() *http.Request {
			r := form.postForm("/delete", ids(id))
			r.Header.Del("Sec-Fetch-Site")
			r.Header.Set("Origin", "null")
			return r
		}, http.StatusForbidden},
		{"Origin null, cross-site", on, func() *http.Request {
			r := form.postForm("/delete", ids(id))
			r.Header.Set("Sec-Fetch-Site", "cross-site")
			r.Header.Set("Origin", "null")
			return r
		}, http.StatusForbidden},
		{"api: Origin of another host", on, func() *http.Request {
			r := script.postJSON("/api/delete", id)
			r.Header.Set("Origin", "http://evil.example")
			return r
		}, http.StatusForbidden},

		// The token.
		{"missing token", on, func() *http.Request { return session{cookie: form.cookie}.postForm("/delete", ids(id)) }, http.StatusForbidden},
		{"wrong token", on, func() *http.Request {
			return session{cookie: form.cookie, token: strings.Repeat("A", len(form.token))}.postForm("/delete", ids(id))
		}, http.StatusForbidden},
		{"token of another handler", on, func() *http.Request { return stranger.postForm("/delete", ids(id)) }, http.StatusForbidden},
		{"token without its cookie", on, func() *http.Request { return session{token: form.token}.postForm("/delete", ids(id)) }, http.StatusForbidden},
		{"token with another cookie", on, func() *http.Request {
			return session{cookie: stranger.cookie, token: form.token}.postForm("/delete", ids(id))
		}, http.StatusForbidden},
		{"token in the URL, not the body", on, func() *http.Request {
			r := session{cookie: form.cookie}.postForm("/delete?csrf_token="+url.QueryEscape(form.token), ids(id))
			return r
		}, http.StatusForbidden},
		{"api: missing token", on, func() *http.Request { return session{cookie: script.cookie}.postJSON("/api/delete", id) }, http.StatusForbidden},
		{"api: token in the body, not the header", on, func() *http.Request {
			r := httptest.NewRequest("POST", "/api/delete", strings.NewReader(`{"ids":["`+id+`"],"csrf_token":"`+script.token+`"}`))
			r.Header.Set("Content-Type", "application/json")
			r.AddCookie(script.cookie)
			return r
		}, http.StatusForbidden},

		// Malformed.
		{"api: form body", on, func() *http.Request {
			r := script.postJSON("/api/delete", id)
			r.Header.Set("Content-Type", "application/x-www-form-urlencoded")
			return r
		}, http.StatusUnsupportedMediaType},
		{"api: unknown field", on, func() *http.Request {
			r := httptest.NewRequest("POST", "/api/delete", strings.NewReader(`{"id":"`+id+`"}`))
			r.Header.Set("Content-Type", "application/json")
			r.Header.Set("X-CSRF-Token", script.token)
			r.AddCookie(script.cookie)
			return r
		}, http.StatusBadRequest},
		{"api: no ids", on, func() *http.Request { return script.postJSON("/api/delete") }, http.StatusBadRequest},
		{"api: too many ids", on, func() *http.Request { return script.postJSON("/api/delete", make([]string, MaxActionIDs+1)...) }, http.StatusBadRequest},
		{"form: too many ids", on, func() *http.Request {
			return form.postForm("/delete", url.Values{"id": make([]string, MaxActionIDs+1)})
		}, http.StatusBadRequest},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			w := do(tt.h, tt.req())
			assert.Equal(t, tt.want, w.Code, w.Body.String())
			if w.Code == http.StatusForbidden {
				assert.Contains(t, w.Body.String(), "admin: forbidden: ")
			}
			_, ok, err := b.DeadLetters().Get(context.Background(), id)
			require.NoError(t, err)
			require.True(t, ok, "the dead letter must still be there")
		})
	}
}

// TestReadOnlyPagesHaveNoActions: without AllowActions no button, checkbox
// or token is on any page, and no cookie is set.
func TestReadOnlyPagesHaveNoActions(t *testing.T) {
	b := failingBroker(t)
	id := listIDs(t, b, broker.DeadLetterFilter{})[0]
	for _, allow := range []bool{false, true} {
		h := newHandler(t, b, Options{AllowActions: allow})
		for _, p := range []string{"/", "/deadletters", "/deadletters/" + pathEscape(id)} {
			w := get(h, p)
			require.Equal(t, http.StatusOK, w.Code)
			page := w.Body.String()
			if p == "/" {
				assert.NotContains(t, page, "data-action=", "the overview has no actions")
				continue
			}
			assert.Equal(t, allow, strings.Contains(page, `data-action="redrive"`), p)
			assert.Equal(t, allow, strings.Contains(page, `data-action="delete"`), p)
			assert.Equal(t, allow, strings.Contains(page, `name="csrf_token"`), p)
			assert.Equal(t, allow, len(w.Result().Cookies()) == 1, p)
			if allow {
				c := w.Result().Cookies()[0]
				assert.True(t, c.HttpOnly)
				assert.Equal(t, http.SameSiteLaxMode, c.SameSite)
			}
		}
		if p := getOK(t, h, "/deadletters"); allow {
			assert.Contains(t, p, `<input type="checkbox" name="id"`)
			assert.Contains(t, p, `id="mode">actions enabled<`)
			assert.NotContains(t, p, ` checked>`)
			all := getOK(t, h, "/deadletters?select=all") // "select all" without JavaScript
			assert.Equal(t, 5, strings.Count(all, `form="actions-form" aria-label="select" checked>`))
		} else {
			assert.NotContains(t, p, `type="checkbox"`)
			assert.Contains(t, p, `id="mode">read-only<`)
		}
	}
}
