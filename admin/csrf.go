package admin

import (
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"errors"
	"net/http"
	"net/url"
	"strings"
)

// The CSRF defence of action requests (besides the origin checks): a signed
// double-submit cookie. The cookie holds a random nonce; the token is
// HMAC-SHA256(handler key, nonce). A page embeds the token in its forms; an
// action must carry both, and a cross-site page can read neither.
const (
	csrfCookie = "broker_admin_csrf"
	csrfField  = "csrf_token"   // form field of the token
	csrfHeader = "X-CSRF-Token" // header of the token (JSON endpoints)
	nonceBytes = 18
)

var (
	errActionsOff  = errors.New("actions are disabled (Options.AllowActions)")
	errCrossOrigin = errors.New("cross-origin request")
	errBadToken    = errors.New("missing or invalid CSRF token: reload the page")
)

// token returns the CSRF token of the request's cookie nonce, setting a new
// cookie when there is none.
func (h *Handler) token(w http.ResponseWriter, r *http.Request) string {
	nonce, ok := cookieNonce(r)
	if !ok {
		b := make([]byte, nonceBytes)
		rand.Read(b)
		nonce = base64.RawURLEncoding.EncodeToString(b)
		http.SetCookie(w, &http.Cookie{
			Name:     csrfCookie,
			Value:    nonce,
			Path:     mountPath(r),
			HttpOnly: true,
			Secure:   h.secure(r),
			SameSite: http.SameSiteLaxMode,
		})
	}
	return h.sign(nonce)
}

func (h *Handler) sign(nonce string) string {
	m := hmac.New(sha256.New, h.key)
	m.Write([]byte("broker-admin-csrf\x00"))
	m.Write([]byte(nonce))
	return base64.RawURLEncoding.EncodeToString(m.Sum(nil))
}

// cookieNonce returns the request's well-formed nonce cookie.
func cookieNonce(r *http.Request) (string, bool) {
	c, err := r.Cookie(csrfCookie)
	if err != nil {
		return "", false
	}
	b, err := base64.RawURLEncoding.DecodeString(c.Value)
	if err != nil || len(b) != nonceBytes {
		return "", false
	}
	return c.Value, true
}

// validToken reports whether tok is the token of the request's cookie.
func (h *Handler) validToken(r *http.Request, tok string) bool {
	nonce, ok := cookieNonce(r)
	if !ok || tok == "" {
		return false
	}
	return hmac.Equal([]byte(tok), []byte(h.sign(nonce)))
}

// checkOrigin refuses a cross-site request: a Sec-Fetch-Site other than
// same-origin or none, or an Origin whose host is not the request's Host
// (a trusted origin aside). Requests with neither header (scripts) pass;
// the token stops them if they come from a browser.
func (h *Handler) checkOrigin(r *http.Request) error {
	if err := h.cop.Check(r); err != nil {
		return errCrossOrigin
	}
	// CrossOriginProtection trusts Sec-Fetch-Site: same-origin without
	// looking at Origin; an Origin that is present must match as well.
	origin := r.Header.Get("Origin")
	if origin == "" {
		return nil
	}
	// Under Referrer-Policy: no-referrer (set on every page) browsers send
	// "Origin: null" with the pages' own form posts; Sec-Fetch-Site:
	// same-origin, which only a browser sets, vouches for those.
	if origin == "null" && r.Header.Get("Sec-Fetch-Site") == "same-origin" {
		return nil
	}
	for _, o := range h.opts.TrustedOrigins {
		if origin == o {
			return nil
		}
	}
	if u, err := url.Parse(origin); err != nil || u.Host == "" || !strings.EqualFold(u.Host, r.Host) {
		return errCrossOrigin
	}
	return nil
}

// mountPath is the path the handler is mounted at, with a trailing slash,
// as far as the request tells (http.StripPrefix keeps RequestURI whole);
// "/" when it does not.
func mountPath(r *http.Request) string {
	u, err := url.ParseRequestURI(r.RequestURI)
	if err != nil {
		return "/"
	}
	full, rest := u.EscapedPath(), r.URL.EscapedPath()
	if !strings.HasSuffix(full, rest) {
		return "/"
	}
	p := strings.TrimSuffix(strings.TrimSuffix(full, rest), "/") + "/"
	for i := 0; i < len(p); i++ { // what a cookie path may hold
		if c := p[i]; c <= ' ' || c >= 0x7f || c == ';' || c == '"' || c == '\\' {
			return "/"
		}
	}
	return p
}
