package admin

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/inproc/broker"
)

// switchBroker has subscriber orders/flaky, which fails permanently while
// failing is set, with 5 dead letters, and orders/mailer with 2.
func switchBroker(t *testing.T) (*broker.Broker, *atomic.Bool, *atomic.Int64) {
	t.Helper()
	b := newBroker(t)
	var failing atomic.Bool
	var delivered atomic.Int64
	failing.Store(true)
	_, err := b.Subscribe("orders", "flaky", func(context.Context, broker.Message) error {
		if failing.Load() {
			return broker.Permanent(errors.New("down"))
		}
		delivered.Add(1)
		return nil
	})
	require.NoError(t, err)
	for i := range 5 {
		publish(t, b, broker.Message{ID: fmt.Sprint("f", i), Topic: "orders"})
	}
	waitDeadLetters(t, b, 5)
	_, err = b.Subscribe("orders", "mailer", bad)
	require.NoError(t, err)
	publish(t, b, broker.Message{ID: "m0", Topic: "orders"}) // flaky fails it too
	publish(t, b, broker.Message{ID: "m1", Topic: "orders"})
	waitDeadLetters(t, b, 9)
	return b, &failing, &delivered
}

// TestActOnAllMatching: the list offers "redrive all N matching" and
// "delete all N matching", each asking for confirmation with the count;
// posting them redrives (through Broker.RedriveMatching) or deletes the
// matches and nothing else.
func TestActOnAllMatching(t *testing.T) {
	b, failing, delivered := switchBroker(t)
	h := newHandler(t, b, Options{AllowActions: true})
	page := getOK(t, h, "/deadletters?subscriber=flaky")
	assert.Contains(t, page, "Redrive all 7 matching")
	assert.Contains(t, page, `data-confirm="Redrive all 7 dead letters matching this filter?`)
	assert.Contains(t, page, `data-confirm="Delete all 7 dead letters matching this filter?`)
	assert.NotContains(t, getOK(t, h, "/deadletters?subscriber=flaky&message_id=f1"), "matching-form", "not with a message ID")

	failing.Store(false)
	s := formSession(t, h, "/deadletters?subscriber=flaky")
	w := do(h, s.postForm("/redrive-matching", url.Values{"subscriber": {"flaky"}, "count": {"7"}}))
	require.Equal(t, http.StatusSeeOther, w.Code, w.Body.String())
	assert.Equal(t, "deadletters?done=redrive_matching&ok=7&subscriber=flaky", w.Header().Get("Location"))
	waitFor(t, "redriven deliveries", func() bool { return delivered.Load() == 7 })
	assert.Len(t, listIDs(t, b, broker.DeadLetterFilter{}), 2, "mailer's two stay")
	assert.Contains(t, getOK(t, h, "/"+w.Header().Get("Location")), "Redrove 7 dead letters.")

	w = do(h, s.postForm("/delete-matching", url.Values{"subscriber": {"mailer"}, "count": {"1"}}))
	require.Equal(t, http.StatusSeeOther, w.Code, w.Body.String())
	assert.Len(t, listIDs(t, b, broker.DeadLetterFilter{}), 1, "count bounds what is deleted")
	w = do(h, s.postForm("/delete-matching", url.Values{"subscriber": {"mailer"}, "count": {"5"}}))
	require.Equal(t, http.StatusSeeOther, w.Code, w.Body.String())
	assert.Contains(t, w.Header().Get("Location"), "ok=1")
	assert.Empty(t, listIDs(t, b, broker.DeadLetterFilter{}))

	for _, count := range []string{"", "0", "x", "10001"} {
		w = do(h, s.postForm("/redrive-matching", url.Values{"count": {count}}))
		assert.Equal(t, http.StatusBadRequest, w.Code, "count %q", count)
	}
	w = do(h, session{}.postForm("/delete-matching", url.Values{"count": {"1"}}))
	assert.Equal(t, http.StatusForbidden, w.Code, "no CSRF token")
}

// TestAuthorizeRoles: with Authorize, one handler serves a read-only role
// (no buttons, every action refused) and an operator who may redrive but
// not delete.
func TestAuthorizeRoles(t *testing.T) {
	b, _, _ := switchBroker(t)
	var asked []string
	h := newHandler(t, b, Options{AllowActions: true, Authorize: func(r *http.Request, action string) error {
		switch r.Header.Get("X-Role") {
		case "operator":
			if strings.HasPrefix(action, "delete") {
				return errors.New("operators do not delete")
			}
			return nil
		case "panic":
			panic("no")
		}
		return errors.New("read-only")
	}})
	as := func(role string, req *http.Request) *http.Request {
		req.Header.Set("X-Role", role)
		return req
	}
	view := do(h, as("viewer", httptestGet("/deadletters")))
	require.Equal(t, http.StatusOK, view.Code)
	assert.NotContains(t, view.Body.String(), "actions-form", "a viewer sees no actions")
	assert.NotContains(t, do(h, as("panic", httptestGet("/deadletters"))).Body.String(), "actions-form")

	op := do(h, as("operator", httptestGet("/deadletters")))
	page := op.Body.String()
	assert.Contains(t, page, `data-action="redrive"`)
	assert.Contains(t, page, `data-action="redrive-matching"`)
	assert.NotContains(t, page, `data-action="delete"`)
	assert.NotContains(t, page, `data-action="delete-matching"`)

	m := tokenRe.FindStringSubmatch(page) // the operator's cookie and token
	require.NotNil(t, m)
	cs := op.Result().Cookies()
	require.Len(t, cs, 1)
	s := session{cookie: cs[0], token: unescape(m[1])}
	id := listIDs(t, b, broker.DeadLetterFilter{})[0]
	for _, tc := range []struct {
		role, path string
		form       url.Values
		want       int
	}{
		{"viewer", "/redrive", url.Values{"id": {id}}, http.StatusForbidden},
		{"viewer", "/redrive-matching", url.Values{"count": {"1"}}, http.StatusForbidden},
		{"operator", "/delete", url.Values{"id": {id}}, http.StatusForbidden},
		{"operator", "/delete-matching", url.Values{"count": {"1"}}, http.StatusForbidden},
		{"panic", "/redrive", url.Values{"id": {id}}, http.StatusForbidden},
		{"operator", "/redrive", url.Values{"id": {id}}, http.StatusSeeOther},
	} {
		w := do(h, as(tc.role, s.postForm(tc.path, tc.form)))
		assert.Equal(t, tc.want, w.Code, "%s POST %s", tc.role, tc.path)
		asked = append(asked, tc.role)
	}
	w := do(h, as("viewer", s.postJSON("/api/delete", id)))
	assert.Equal(t, http.StatusForbidden, w.Code, "the API asks too")
	assert.Len(t, asked, 6)
}

// TestSecureCookieBehindProxy: the CSRF cookie is Secure over TLS, with
// SecureCookie, and with TrustForwardedProto when the proxy says https;
// not on plain HTTP otherwise, nor for a client's own X-Forwarded-Proto
// without the option.
func TestSecureCookieBehindProxy(t *testing.T) {
	b := newBroker(t)
	for _, tc := range []struct {
		name  string
		o     Options
		proto string
		want  bool
	}{
		{"plain", Options{}, "", false},
		{"forwarded, untrusted", Options{}, "https", false},
		{"SecureCookie", Options{SecureCookie: true}, "", true},
		{"forwarded, trusted", Options{TrustForwardedProto: true}, "https", true},
		{"forwarded http, trusted", Options{TrustForwardedProto: true}, "http", false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tc.o.AllowActions = true
			h := newHandler(t, b, tc.o)
			req := httptestGet("/deadletters")
			if tc.proto != "" {
				req.Header.Set("X-Forwarded-Proto", tc.proto)
			}
			cs := do(h, req).Result().Cookies()
			require.Len(t, cs, 1)
			assert.Equal(t, tc.want, cs[0].Secure)
		})
	}
}

func httptestGet(target string) *http.Request {
	return httptest.NewRequest(http.MethodGet, target, nil)
}
