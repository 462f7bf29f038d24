package admin

import "time"

// This file is the JSON the endpoints serve. Field names are snake_case;
// durations are float seconds; a rate is null until two samples give it.

// Snapshot is the body of GET api/stats: Broker.Stats with rates and chart
// samples. Topics are sorted by name.
type Snapshot struct {
	SampledAt time.Time `json:"sampled_at"` // when Stats was read
	// IntervalSeconds is the least time between two samples
	// (Options.SampleInterval), which is also the overview's refresh period.
	IntervalSeconds   float64         `json:"interval_seconds"`
	Backlog           int             `json:"backlog"`      // sum of the live topics' backlogs
	LiveTopics        int             `json:"live_topics"`  // topics with a queue (subscribers or messages)
	DeadLetters       int             `json:"dead_letters"` // dead letters in the store now; -1 if the store failed
	DeadLetterEvicted uint64          `json:"dead_letter_evicted"`
	PluginPanics      uint64          `json:"plugin_panics"`
	ForgottenTopics   uint64          `json:"forgotten_topics"`
	Dedup             DedupSnapshot   `json:"dedup"`
	Topics            []TopicSnapshot `json:"topics"`
}

// DedupSnapshot is broker.DedupStats.
type DedupSnapshot struct {
	Capacity               int     `json:"capacity"`
	Entries                int     `json:"entries"`
	WindowSeconds          float64 `json:"window_seconds"`
	ForgottenEarly         uint64  `json:"forgotten_early"`
	EffectiveWindowSeconds float64 `json:"effective_window_seconds"`
}

// TopicSnapshot is one topic of a Snapshot: broker.TopicStats, its rates
// and its chart.
type TopicSnapshot struct {
	Name string `json:"name"`
	// Live is true for a topic with a queue (an active subscriber or
	// messages queued); a retired topic's counters are still in Stats.
	Live                 bool     `json:"live"`
	Published            uint64   `json:"published"`
	Rejected             uint64   `json:"rejected"`
	Unrouted             uint64   `json:"unrouted"`
	Queued               int      `json:"queued"`   // in the topic queue
	Capacity             int      `json:"capacity"` // of the topic queue
	OldestAgeSeconds     float64  `json:"oldest_age_seconds"`
	BlockedOn            string   `json:"blocked_on"`
	Backlog              int      `json:"backlog"`      // topic queue plus every subscriber's backlog
	PublishRate          *float64 `json:"publish_rate"` // messages/s accepted between the last two samples
	DeadLettered         uint64   `json:"dead_lettered"`
	ForgottenSubscribers uint64   `json:"forgotten_subscribers"`
	// Chart is the backlog over the last samples (live topics only).
	Chart       Chart                `json:"chart"`
	Subscribers []SubscriberSnapshot `json:"subscribers"` // sorted by name
}

// SubscriberSnapshot is broker.SubscriberStats with its delivery rate.
type SubscriberSnapshot struct {
	Name              string   `json:"name"`
	Active            bool     `json:"active"`
	Concurrency       int      `json:"concurrency"`
	Backlog           int      `json:"backlog"` // Queued + InFlight
	Queued            int      `json:"queued"`
	Held              int      `json:"held"`
	Parked            int      `json:"parked"`
	InFlight          int      `json:"in_flight"`
	Capacity          int      `json:"capacity"` // lane capacity
	OldestAgeSeconds  float64  `json:"oldest_age_seconds"`
	Breaker           string   `json:"breaker"` // "" without a breaker, else closed, open or half_open
	RetryBudgetLeft   int      `json:"retry_budget_left"`
	BlockedForSeconds float64  `json:"blocked_for_seconds"`
	Routed            uint64   `json:"routed"`
	Delivered         uint64   `json:"delivered"`
	Attempts          uint64   `json:"attempts"`
	Retries           uint64   `json:"retries"`
	DeadLettered      uint64   `json:"dead_lettered"`
	Deduplicated      uint64   `json:"deduplicated"`
	DeadLetterErrors  uint64   `json:"dead_letter_errors"`
	RetryRate         float64  `json:"retry_rate"`     // Retries / Attempts
	FailureRate       float64  `json:"failure_rate"`   // dead-lettered share of finished messages
	DeliveredRate     *float64 `json:"delivered_rate"` // messages/s delivered between the last two samples
}

// Chart is a topic's backlog over its last samples, oldest first, and the
// same drawn as the points of an SVG polyline in a ChartWidth × ChartHeight
// box (the newest sample at the right edge, Max at the top).
type Chart struct {
	Points  string   `json:"points"`
	Max     int      `json:"max"`
	Samples []Sample `json:"samples"`
}

// Sample is one point of a Chart.
type Sample struct {
	At      time.Time `json:"at"`
	Backlog int       `json:"backlog"`
}

// DeadLetterList is the body of GET api/deadletters: one page of the dead
// letters matching the query, newest first unless order=oldest. Each
// error is cut to ListErrorLimit bytes (the detail has it whole).
type DeadLetterList struct {
	DeadLetters []DeadLetterSummary `json:"dead_letters"`
	Offset      int                 `json:"offset"`
	Limit       int                 `json:"limit"`
	NewestFirst bool                `json:"newest_first"`
	// More is true when more dead letters match after this page.
	More bool `json:"more"`
	// Truncated is true, oldest first, when more than Options.MaxScan dead
	// letters match the store's filter and the handler filtered only the
	// first MaxScan by message ID or time: later ones were not looked at.
	Truncated bool `json:"truncated"`
	// Stored is how many dead letters the store holds, all filters aside;
	// -1 if the store failed to say.
	Stored int `json:"stored"`
}

// DeadLetterSummary is a dead letter without its headers and payload.
type DeadLetterSummary struct {
	ID          string    `json:"id"`
	Topic       string    `json:"topic"`
	Subscriber  string    `json:"subscriber"`
	MessageID   string    `json:"message_id"`
	Key         string    `json:"key"`
	Attempts    int       `json:"attempts"`
	ErrorCode   string    `json:"error_code"`
	Error       string    `json:"error"`
	Retryable   bool      `json:"retryable"`
	Reason      string    `json:"reason"`
	FailedAt    time.Time `json:"failed_at"`
	PublishedAt time.Time `json:"published_at"`
	PayloadSize int       `json:"payload_size"`
	ErrorSize   int       `json:"error_size"` // bytes of the whole error
	// ErrorTruncated is true in a list when Error was cut to
	// ListErrorLimit bytes.
	ErrorTruncated bool `json:"error_truncated,omitempty"`
}

// DeadLetterDetail is the body of GET api/deadletters/{id}: the whole dead
// letter.
type DeadLetterDetail struct {
	DeadLetterSummary
	Attempt int               `json:"attempt"` // the message's last attempt number
	Headers map[string]string `json:"headers"`
	// The payload comes whole, in one encoding: PayloadText when it is
	// printable UTF-8 (letters, marks, numbers, punctuation, symbols,
	// spaces, tabs and line breaks; no control or format characters),
	// else Payload (base64 in JSON). With ?payload=base64 it is always
	// Payload.
	Payload     []byte  `json:"payload,omitempty"`
	PayloadText *string `json:"payload_text,omitempty"`
}

// ActionRequest is the body of POST api/redrive and POST api/delete.
type ActionRequest struct {
	IDs []string `json:"ids"` // dead-letter IDs, at most MaxActionIDs
}

// ActionResult is the answer to an action: which IDs it did and which
// failed, and why.
type ActionResult struct {
	Action string          `json:"action"` // "redrive" or "delete"
	Done   []string        `json:"done"`
	Failed []ActionFailure `json:"failed"`
}

// ActionFailure is one ID an action could not do.
type ActionFailure struct {
	ID string `json:"id"`
	// Code is not_found, no_subscriber (the subscriber that failed it is
	// gone), queue_full, closed (the broker is closed), canceled (the
	// request ended) or error.
	Code  string `json:"code"`
	Error string `json:"error"`
}

// TokenResponse is the body of GET api/token: the CSRF token to send in the
// X-CSRF-Token header of action requests, with the cookie the response sets.
type TokenResponse struct {
	Token  string `json:"token"`
	Header string `json:"header"` // "X-CSRF-Token"
}
