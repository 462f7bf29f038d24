package browsertest_test

import (
	"fmt"
	"html/template"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/inproc/broker"
)

// attackPage is a page that posts a form to the admin's redrive endpoint as
// soon as it has loaded, with the fields it is given (an attacker who knows
// a valid CSRF token: the worst case).
var attackPage = template.Must(template.New("attack").Parse(`<!doctype html>
<title>free prizes</title>
<form id="attack" method="post" action="{{.Action}}">
  <input type="hidden" name="csrf_token" value="{{.Token}}">
  <input type="hidden" name="id" value="{{.ID}}">
</form>
<script>window.addEventListener('load', () => setTimeout(() => document.getElementById('attack').submit(), 0));</script>
`))

// serveAttack serves attackPage with the query's action, token and id.
func serveAttack(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	w.Header().Set("Content-Type", "text/html; charset=utf-8")
	_ = attackPage.Execute(w, map[string]string{"Action": q.Get("action"), "Token": q.Get("token"), "ID": q.Get("id")})
}

// TestCrossSitePostRefused has the browser load a page of another origin
// that auto-submits a redrive form to the admin, with a valid CSRF token
// in it: from the same host on another port (same site, so the browser
// sends the admin's cookie too) and from another site ("localhost" for
// "127.0.0.1"). The admin answers 403, the dead letter stays and the
// subscriber never gets the message. The control, the same page served from
// the admin's own origin, redrives.
func TestCrossSitePostRefused(t *testing.T) {
	s, k, _ := actionsSite(t, 0)
	s.mux.HandleFunc("GET /evil", serveAttack) // the admin's origin: the control
	other := httptest.NewServer(http.HandlerFunc(serveAttack))
	t.Cleanup(other.Close)
	otherURL, err := url.Parse(other.URL)
	require.NoError(t, err)
	require.Equal(t, "127.0.0.1", otherURL.Hostname(), "httptest listens on 127.0.0.1")
	br := newBrowser(t)

	tests := []struct {
		name     string
		page     string // the attack page's URL, without its query
		site     string // the Sec-Fetch-Site the browser sends
		cookie   bool   // whether it sends the admin's cookie
		refused  bool
		wantPage string // the page the browser ends on
	}{
		{"control: same origin", s.srv.URL + "/evil", "same-origin", true, false, "deadletters"},
		{"same site, another port", other.URL + "/", "same-site", true, true, "error"},
		{"another site", "http://localhost:" + otherURL.Port() + "/", "cross-site", false, true, "error"},
	}
	for i, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			// A fresh dead letter, and a token of the browser's session.
			msgID := fmt.Sprintf("order-%d", i+1)
			s.publish(t, broker.Message{ID: msgID, Topic: "orders"})
			dl := s.waitDeadLetters(t, 1)[0]
			require.Equal(t, msgID, dl.Message.ID)
			br.open(t, s.admin+"deadletters")
			token := eval[string](t, br, `document.querySelector('#actions-form input[name=csrf_token]').value`)
			require.NotEmpty(t, token)
			posts := len(s.posts(prefix + "redrive"))

			q := url.Values{"action": {s.admin + "redrive"}, "token": {token}, "id": {dl.ID}}
			br.open(t, tt.page+"?"+q.Encode())
			br.do(t, chromedp.WaitReady(chromedp.CSS(`body[data-page]`))) // the admin's answer, loaded
			require.True(t, strings.HasPrefix(eval[string](t, br, `location.href`), s.admin))

			var got []request
			require.Eventually(t, func() bool { got = s.posts(prefix + "redrive"); return len(got) > posts },
				waitFor, 5*time.Millisecond, "the form should reach the admin")
			require.Len(t, got, posts+1, "the form reached the admin once")
			req := got[len(got)-1]
			assert.Equal(t, tt.site, req.SecFetchSite, "Sec-Fetch-Site")
			assert.Equal(t, tt.cookie, req.HasCSRFCookie, "the admin's cookie was sent")
			assert.Equal(t, tt.wantPage, br.page(t))
			if tt.refused {
				assert.Equal(t, http.StatusForbidden, req.Status, "the admin's answer")
				assert.Equal(t, "403", eval[string](t, br, `document.getElementById('error-status').dataset.status`))
				assert.True(t, s.has(t, dl.ID), "the dead letter stays")
				assert.NotContains(t, k.taken(), msgID, "the subscriber never got it")
				require.NoError(t, s.b.DeadLetters().Delete(t.Context(), dl.ID)) // the next case starts empty
				return
			}
			assert.Equal(t, http.StatusSeeOther, req.Status, "the admin's answer")
			assert.Equal(t, "redrive", eval[string](t, br, `document.getElementById('notice').dataset.done`))
			assert.Equal(t, []string{msgID}, waitTaken(t, k, 1), "the subscriber got it")
			assert.False(t, s.has(t, dl.ID), "the dead letter left the store")
		})
	}
	assert.Equal(t, []string{"order-1"}, k.taken(), "only the control's message was delivered")
}
