package admin

import (
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"net/url"
	"strconv"

	"github.com/inproc/broker"
)

// This file is the actions on every dead letter matching a filter, the
// Authorize hook, and the CSRF cookie's Secure flag.

// errNotAuthorized is wrapped by the refusal of an action Authorize
// refused.
var errNotAuthorized = errors.New("not authorized for this action")

// authorize asks Options.Authorize about action; nil without a hook.
func (h *Handler) authorize(r *http.Request, action string) (err error) {
	if h.opts.Authorize == nil {
		return nil
	}
	defer func() {
		if v := recover(); v != nil {
			err = fmt.Errorf("%w: Authorize panicked: %v", errNotAuthorized, v)
		}
	}()
	if err := h.opts.Authorize(r, action); err != nil {
		return fmt.Errorf("%w (%s): %v", errNotAuthorized, action, err)
	}
	return nil
}

// canAct reports whether the page shows r the action buttons: actions on,
// and Authorize allowing r at least one action.
func (h *Handler) canAct(r *http.Request) bool {
	if !h.opts.AllowActions {
		return false
	}
	for _, a := range []string{ActionRedrive, ActionDelete, ActionRedriveMatching, ActionDeleteMatching} {
		if h.authorize(r, a) == nil {
			return true
		}
	}
	return false
}

// secure reports whether the CSRF cookie is marked Secure for r.
func (h *Handler) secure(r *http.Request) bool {
	return r.TLS != nil || h.opts.SecureCookie ||
		h.opts.TrustForwardedProto && r.Header.Get("X-Forwarded-Proto") == "https"
}

// matchingFilter is the store filter of a list query that an action on
// "all matching" can take: topic, subscriber, code and reason. ok is false
// for a query with a message ID or a time range, which
// broker.RedriveMatching does not take.
func (q listQuery) matchingFilter() (broker.DeadLetterFilter, bool) {
	f := broker.DeadLetterFilter{Topic: q.Topic, Subscriber: q.Subscriber, ErrorCode: q.Code, Reason: q.Reason}
	return f, q.MessageID == "" && q.Since.IsZero() && q.Until.IsZero()
}

// countMatching is how many dead letters match f, at most limit+1 counted
// (more than limit: the store holds more than the page says).
func (h *Handler) countMatching(r *http.Request, f broker.DeadLetterFilter, limit int) (int, error) {
	f.Limit = limit + 1
	dls, err := h.b.DeadLetters().List(r.Context(), f)
	n := 0
	for _, dl := range dls {
		if f.Match(dl) {
			n++
		}
	}
	return n, err
}

// matchingAction serves POST redrive-matching and POST delete-matching
// from the list's form: the filter fields topic, subscriber, code and
// reason, csrf_token, and count, the number of matches the page showed
// (and its confirmation named). Redrive goes through
// Broker.RedriveMatching (a snapshot of the matches, at most count of
// them); delete deletes at most count of the oldest matches, MaxScan at
// most. It answers 303 See Other to the list, filtered as it was, which
// states the result.
func (h *Handler) matchingAction(a string) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		if !h.actionForm(w, r, action(a)) {
			return
		}
		count, err := strconv.Atoi(r.PostForm.Get("count"))
		if err != nil || count < 1 || count > h.opts.MaxScan {
			h.fail(w, r, false, http.StatusBadRequest, fmt.Sprintf("count %q: want the number of matches the page showed, 1 to %d", cut(40, r.PostForm.Get("count")), h.opts.MaxScan))
			return
		}
		f := broker.DeadLetterFilter{Topic: r.PostForm.Get("topic"), Subscriber: r.PostForm.Get("subscriber"),
			ErrorCode: r.PostForm.Get("code"), Reason: r.PostForm.Get("reason"), Limit: count}
		var done, failed int
		var why string
		switch a {
		case ActionRedriveMatching:
			var err error
			done, err = h.b.RedriveMatching(r.Context(), f)
			if err != nil {
				failed, why = max(1, count-done), failureCode(err)
			}
		case ActionDeleteMatching:
			dls, err := h.b.DeadLetters().List(r.Context(), f)
			var ids []string
			for _, dl := range dls {
				if f.Match(dl) && len(ids) < count {
					ids = append(ids, dl.ID)
				}
			}
			if err == nil && len(ids) > 0 {
				err = h.b.DeadLetters().Delete(r.Context(), ids...)
			}
			if err != nil {
				failed, why = max(1, len(ids)), failureCode(err)
			} else {
				done = len(ids)
			}
		}
		h.opts.Logger.LogAttrs(r.Context(), slog.LevelInfo, "admin: "+a,
			slog.String("topic", f.Topic), slog.String("subscriber", f.Subscriber),
			slog.String("code", f.ErrorCode), slog.String("reason", f.Reason), slog.Int("count", count),
			slog.Int("done", done), slog.Int("failed", failed), slog.String("remote", r.RemoteAddr))
		back := url.Values{}
		for _, k := range []string{"topic", "subscriber", "code", "reason", "order"} {
			if v := r.PostForm.Get(k); v != "" {
				back.Set(k, v)
			}
		}
		back.Set("done", a)
		back.Set("ok", strconv.Itoa(done))
		if failed > 0 {
			back.Set("failed", strconv.Itoa(failed))
			back.Set("why", why)
		}
		w.Header().Set("Location", "deadletters?"+back.Encode())
		w.Header().Set("Cache-Control", "no-store")
		w.WriteHeader(http.StatusSeeOther)
	}
}
