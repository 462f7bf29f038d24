package admin

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"mime"
	"net/http"
	"net/url"
	"strconv"

	"github.com/inproc/broker"
)

type action string

const (
	actionRedrive action = "redrive"
	actionDelete  action = "delete"
)

// allowed refuses an action request before its body is read: actions off,
// cross origin, or not authorized.
func (h *Handler) allowed(r *http.Request, a action) error {
	if !h.opts.AllowActions {
		return errActionsOff
	}
	if err := h.checkOrigin(r); err != nil {
		return err
	}
	return h.authorize(r, string(a))
}

// refuse logs a refused action request and answers 403.
func (h *Handler) refuse(w http.ResponseWriter, r *http.Request, a action, api bool, err error) {
	h.opts.Logger.LogAttrs(r.Context(), slog.LevelWarn, "admin: action refused",
		slog.String("action", string(a)), slog.String("why", err.Error()),
		slog.String("remote", r.RemoteAddr), slog.String("origin", r.Header.Get("Origin")),
		slog.String("sec_fetch_site", r.Header.Get("Sec-Fetch-Site")))
	h.fail(w, r, api, http.StatusForbidden, "forbidden: "+err.Error())
}

// formAction serves POST redrive and POST delete from the pages' forms:
// fields id (repeated) and csrf_token; the filter fields topic, subscriber,
// code and reason say where to go back. It answers 303 See Other to the
// dead-letter list, which states the result.
func (h *Handler) formAction(a action) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		if !h.actionForm(w, r, a) {
			return
		}
		ids, err := cleanIDs(r.PostForm["id"])
		if err != nil {
			h.fail(w, r, false, http.StatusBadRequest, err.Error())
			return
		}
		res := h.do(r, a, ids)
		back := url.Values{}
		for _, k := range []string{"topic", "subscriber", "code", "reason", "message_id", "since", "until", "order"} {
			if v := r.PostForm.Get(k); v != "" {
				back.Set(k, v)
			}
		}
		back.Set("done", string(a))
		back.Set("ok", strconv.Itoa(len(res.Done)))
		if len(res.Failed) > 0 {
			back.Set("failed", strconv.Itoa(len(res.Failed)))
			back.Set("why", res.Failed[0].Code)
		}
		// Relative to this request (…/redrive), like every link here, so it
		// works under any prefix; http.Redirect would make it absolute from
		// the stripped path.
		w.Header().Set("Location", "deadletters?"+back.Encode())
		w.Header().Set("Cache-Control", "no-store")
		w.WriteHeader(http.StatusSeeOther)
	}
}

// apiAction serves POST api/redrive and POST api/delete: an ActionRequest
// in JSON, the token in the X-CSRF-Token header; it answers an
// ActionResult (200 even when some IDs failed).
func (h *Handler) apiAction(a action) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		err := h.allowed(r, a)
		if err == nil && !h.validToken(r, r.Header.Get(csrfHeader)) {
			err = errBadToken
		}
		if err != nil {
			h.refuse(w, r, a, true, err)
			return
		}
		if mt, _, err := mime.ParseMediaType(r.Header.Get("Content-Type")); err != nil || mt != "application/json" {
			h.fail(w, r, true, http.StatusUnsupportedMediaType, "the body must be application/json")
			return
		}
		var req ActionRequest
		dec := json.NewDecoder(http.MaxBytesReader(w, r.Body, maxActionBody))
		dec.DisallowUnknownFields()
		if err := dec.Decode(&req); err != nil {
			h.fail(w, r, true, http.StatusBadRequest, "bad body: "+err.Error())
			return
		}
		ids, err := cleanIDs(req.IDs)
		if err != nil {
			h.fail(w, r, true, http.StatusBadRequest, err.Error())
			return
		}
		if len(ids) == 0 {
			h.fail(w, r, true, http.StatusBadRequest, "no ids")
			return
		}
		writeJSON(w, http.StatusOK, h.do(r, a, ids))
	}
}

// cleanIDs drops empty and repeated IDs, and refuses too many.
func cleanIDs(in []string) ([]string, error) {
	if len(in) > MaxActionIDs {
		return nil, fmt.Errorf("%d ids: at most %d per request", len(in), MaxActionIDs)
	}
	seen := make(map[string]bool, len(in))
	out := make([]string, 0, len(in))
	for _, id := range in {
		if id != "" && !seen[id] {
			seen[id] = true
			out = append(out, id)
		}
	}
	return out, nil
}

// do runs the action on ids, one at a time so that each failure is known,
// and logs it.
func (h *Handler) do(r *http.Request, a action, ids []string) ActionResult {
	ctx := r.Context()
	res := ActionResult{Action: string(a), Done: []string{}, Failed: []ActionFailure{}}
	switch a {
	case actionRedrive:
		for _, id := range ids {
			if _, err := h.b.Redrive(ctx, id); err != nil {
				res.Failed = append(res.Failed, ActionFailure{ID: id, Code: failureCode(err), Error: err.Error()})
				continue
			}
			res.Done = append(res.Done, id)
		}
	case actionDelete:
		store := h.b.DeadLetters()
		var found []string
		for _, id := range ids {
			_, ok, err := store.Get(ctx, id)
			switch {
			case err != nil:
				res.Failed = append(res.Failed, ActionFailure{ID: id, Code: failureCode(err), Error: err.Error()})
			case !ok:
				err := fmt.Errorf("%w: %q", broker.ErrDeadLetterNotFound, id)
				res.Failed = append(res.Failed, ActionFailure{ID: id, Code: "not_found", Error: err.Error()})
			default:
				found = append(found, id)
			}
		}
		if len(found) > 0 {
			if err := store.Delete(ctx, found...); err != nil {
				for _, id := range found {
					res.Failed = append(res.Failed, ActionFailure{ID: id, Code: failureCode(err), Error: err.Error()})
				}
			} else {
				res.Done = append(res.Done, found...)
			}
		}
	}
	h.opts.Logger.LogAttrs(ctx, slog.LevelInfo, "admin: "+string(a),
		slog.Int("requested", len(ids)), slog.Int("done", len(res.Done)), slog.Int("failed", len(res.Failed)),
		slog.Any("ids", res.Done), slog.String("remote", r.RemoteAddr))
	return res
}

func failureCode(err error) string {
	switch {
	case errors.Is(err, broker.ErrDeadLetterNotFound):
		return "not_found"
	case errors.Is(err, broker.ErrSubscriberNotFound):
		return "no_subscriber"
	case errors.Is(err, broker.ErrQueueFull):
		return "queue_full"
	case errors.Is(err, broker.ErrClosed):
		return "closed"
	case errors.Is(err, context.Canceled), errors.Is(err, context.DeadlineExceeded):
		return "canceled"
	}
	return "error"
}

// failureText says in words what a failure code means, for the notice.
var failureText = map[string]string{
	"not_found":     "not found (already redriven or deleted?)",
	"no_subscriber": "the subscriber that failed it is no longer subscribed",
	"queue_full":    "the subscriber's lane stayed full",
	"closed":        "the broker is closed",
	"canceled":      "the request ended first",
	"error":         "the store failed (see the log)",
}

// actionForm checks that r may run action a and reads its form: the
// role (Authorize), the body's size, the form and its CSRF token. When it
// returns false it has answered.
func (h *Handler) actionForm(w http.ResponseWriter, r *http.Request, a action) bool {
	if err := h.allowed(r, a); err != nil {
		h.refuse(w, r, a, false, err)
		return false
	}
	r.Body = http.MaxBytesReader(w, r.Body, maxActionBody)
	if err := r.ParseForm(); err != nil {
		h.fail(w, r, false, http.StatusBadRequest, "bad form: "+err.Error())
		return false
	}
	if !h.validToken(r, r.PostForm.Get(csrfField)) {
		h.refuse(w, r, a, false, errBadToken)
		return false
	}
	return true
}
