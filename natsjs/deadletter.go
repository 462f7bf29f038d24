package natsjs

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/inproc/broker"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// DeadLetterStore is a broker.DeadLetterStore over a JetStream stream: the
// dead letters survive restarts, and every replica of a service connected
// to the same NATS shares them. It is safe for concurrent use, and several
// stores (in one process or many) may use the same stream at once.
//
// Each dead letter is one message, JSON-encoded, on the subject
//
//	<prefix>.<id>.<topic>.<subscriber>.<error code>
//
// with each name encoded as one token (see the README), so that Get and
// Delete address a dead letter by its ID and List filters by topic,
// subscriber and error code on the server. Stream order is Put order, so
// List is oldest first. A Put of a new ID is one publish, conditional on no
// message of that ID being stored; a Put of an ID already stored publishes
// the new version and then purges the older ones (it becomes the newest).
type DeadLetterStore struct {
	js     jetstream.JetStream
	stream jetstream.Stream
	name   string
	prefix string
}

var _ broker.DeadLetterStore = (*DeadLetterStore)(nil)

// NewDeadLetterStore creates the dead-letter stream if it does not exist
// (updating its configuration to opts if it does) and returns a store over
// it. Options: WithStream, WithSubjectPrefix, WithMaxDeadLetters,
// WithReplicas, WithStorage.
func NewDeadLetterStore(ctx context.Context, js jetstream.JetStream, opts ...Option) (*DeadLetterStore, error) {
	if js == nil {
		return nil, fmt.Errorf("%w: NewDeadLetterStore: nil JetStream", ErrInvalidOption)
	}
	cfg, err := newStoreConfig(deadLetterKind, opts)
	if err != nil {
		return nil, err
	}
	stream, err := js.CreateOrUpdateStream(ctx, jetstream.StreamConfig{
		Name:        cfg.stream,
		Description: "inproc broker dead letters (github.com/inproc/broker/natsjs)",
		Subjects:    []string{cfg.subjectPrefix + ".>"},
		Retention:   jetstream.LimitsPolicy,
		Discard:     jetstream.DiscardOld,
		MaxMsgs:     cfg.maxMsgs,
		Storage:     cfg.storage,
		Replicas:    cfg.replicas,
		// Get asks for the last message on a subject with a wildcard,
		// which the stream's leader answers; a direct get would put the
		// wildcard in a request subject.
		AllowDirect: false,
	})
	if err != nil {
		return nil, fmt.Errorf("natsjs: dead-letter stream %q: %w", cfg.stream, err)
	}
	return &DeadLetterStore{js: js, stream: stream, name: cfg.stream, prefix: cfg.subjectPrefix}, nil
}

// Stream returns the name of the store's stream.
func (s *DeadLetterStore) Stream() string { return s.name }

// subject is where dl is published.
func (s *DeadLetterStore) subject(dl *broker.DeadLetter) string {
	return s.prefix + "." + token(dl.ID) + "." + token(dl.Message.Topic) + "." + token(dl.Subscriber) + "." + token(dl.ErrorCode)
}

// idSubject matches every version of the dead letter with the given ID.
func (s *DeadLetterStore) idSubject(id string) string { return s.prefix + "." + token(id) + ".>" }

// filterSubject matches the dead letters f selects (Limit aside).
func (s *DeadLetterStore) filterSubject(f broker.DeadLetterFilter) string {
	tok := func(name string) string {
		if name == "" {
			return "*"
		}
		return token(name)
	}
	return s.prefix + ".*." + tok(f.Topic) + "." + tok(f.Subscriber) + "." + tok(f.ErrorCode)
}

// Put stores dl, replacing a dead letter with the same ID.
func (s *DeadLetterStore) Put(ctx context.Context, dl broker.DeadLetter) error {
	if ctx == nil { // as the broker: nil is Background
		ctx = context.Background()
	}
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("natsjs: put dead letter %q: %w", dl.ID, err)
	}
	if dl.ID == "" {
		return fmt.Errorf("%w: no ID (topic %q, subscriber %q)", ErrInvalidDeadLetter, dl.Message.Topic, dl.Subscriber)
	}
	data, err := json.Marshal(toRecord(&dl))
	if err != nil {
		return fmt.Errorf("%w: %q: %v", ErrInvalidDeadLetter, dl.ID, err)
	}
	// The common case, a new ID, takes one round trip: the publish is
	// accepted only if no message of this ID is stored.
	subj := s.subject(&dl)
	_, err = s.js.Publish(ctx, subj, data, jetstream.WithExpectStream(s.name),
		jetstream.WithExpectLastSequenceForSubject(0, s.idSubject(dl.ID)))
	if err == nil {
		return nil
	}
	if !wrongLastSequence(err) {
		return s.putError(&dl, len(data), err)
	}
	// The ID is stored: publish the new version, then purge the older ones.
	ack, err := s.js.Publish(ctx, subj, data, jetstream.WithExpectStream(s.name))
	if err != nil {
		return s.putError(&dl, len(data), err)
	}
	// Not cancelled with ctx: the new version is stored, and leaving the old
	// one would show the ID twice until its next Put or Delete (List and
	// Get read the newest meanwhile).
	err = s.stream.Purge(context.WithoutCancel(ctx), jetstream.WithPurgeSubject(s.idSubject(dl.ID)), jetstream.WithPurgeSequence(ack.Sequence))
	if err != nil {
		return fmt.Errorf("natsjs: put dead letter %q: purge the version it replaces: %w", dl.ID, err)
	}
	return nil
}

// putError is Put's error for err, the error of publishing dl (size
// bytes encoded). The client refuses a message whose data and headers
// exceed the server's max_payload (the headers count too, so an encoded
// dead letter a little under it can be refused): that is ErrTooLarge,
// which trying again cannot help.
func (s *DeadLetterStore) putError(dl *broker.DeadLetter, size int, err error) error {
	if errors.Is(err, nats.ErrMaxPayload) {
		return fmt.Errorf("%w: dead letter %q is %d bytes encoded, with its headers more than the server allows (%d)",
			ErrTooLarge, dl.ID, size, s.js.Conn().MaxPayload())
	}
	return fmt.Errorf("natsjs: put dead letter %q: %w", dl.ID, err)
}

// wrongLastSequence reports whether err is JetStream refusing a publish
// whose expected last sequence did not match (code 10071; 10164 on a
// replicated stream).
func wrongLastSequence(err error) bool {
	var apiErr *jetstream.APIError
	return errors.As(err, &apiErr) &&
		(apiErr.ErrorCode == jetstream.JSErrCodeStreamWrongLastSequence ||
			apiErr.ErrorCode == jetstream.JSErrCodeStreamWrongLastSequenceConstant)
}

// Get returns the dead letter with the given ID.
func (s *DeadLetterStore) Get(ctx context.Context, id string) (broker.DeadLetter, bool, error) {
	if ctx == nil { // as the broker: nil is Background
		ctx = context.Background()
	}
	if err := ctx.Err(); err != nil {
		return broker.DeadLetter{}, false, fmt.Errorf("natsjs: get dead letter %q: %w", id, err)
	}
	msg, err := s.stream.GetLastMsgForSubject(ctx, s.idSubject(id))
	if errors.Is(err, jetstream.ErrMsgNotFound) {
		return broker.DeadLetter{}, false, nil
	}
	if err != nil {
		return broker.DeadLetter{}, false, fmt.Errorf("natsjs: get dead letter %q: %w", id, err)
	}
	dl, err := decode(msg.Data, msg.Sequence)
	if err != nil {
		return broker.DeadLetter{}, false, err
	}
	if dl.ID != id { // only a SHA-256 collision of two long IDs
		return broker.DeadLetter{}, false, nil
	}
	return dl, true, nil
}

// listBatch is how many dead letters List asks the server for at a time.
const listBatch = 256

// List returns the dead letters matching f, oldest first. The server
// filters by topic, subscriber and error code; List reads the matches
// through a temporary consumer (in memory, deleted when List returns) and
// filters them by reason itself (the reason is not in the subject).
func (s *DeadLetterStore) List(ctx context.Context, f broker.DeadLetterFilter) ([]broker.DeadLetter, error) {
	if ctx == nil { // as the broker: nil is Background
		ctx = context.Background()
	}
	if err := ctx.Err(); err != nil {
		return nil, fmt.Errorf("natsjs: list dead letters: %w", err)
	}
	if err := f.Validate(); err != nil {
		return nil, fmt.Errorf("natsjs: list dead letters: %w", err)
	}
	cons, err := s.stream.CreateConsumer(ctx, jetstream.ConsumerConfig{
		Description:       "inproc broker: DeadLetterStore.List",
		FilterSubject:     s.filterSubject(f),
		DeliverPolicy:     jetstream.DeliverAllPolicy,
		AckPolicy:         jetstream.AckNonePolicy,
		MemoryStorage:     true,
		Replicas:          1,
		InactiveThreshold: time.Minute, // the server removes it if List dies before deleting it
	})
	if err != nil {
		return nil, fmt.Errorf("natsjs: list dead letters: consumer: %w", err)
	}
	defer func() {
		// Best effort: the InactiveThreshold removes it otherwise.
		_ = s.stream.DeleteConsumer(context.WithoutCancel(ctx), cons.CachedInfo().Name)
	}()
	if cons.CachedInfo().NumPending == 0 {
		return nil, nil
	}
	var out []broker.DeadLetter
	at := map[string]int{} // ID → index in out
	for {
		batch, err := cons.FetchNoWait(listBatch)
		if err != nil {
			return nil, fmt.Errorf("natsjs: list dead letters: fetch: %w", err)
		}
		n, pending := 0, uint64(1)
		for msg := range batch.Messages() {
			n++
			meta, err := msg.Metadata()
			if err != nil {
				return nil, fmt.Errorf("natsjs: list dead letters: %w", err)
			}
			pending = meta.NumPending
			dl, err := decode(msg.Data(), meta.Sequence.Stream)
			if err != nil {
				return nil, err
			}
			if !f.Match(dl) { // another reason, or a SHA-256 collision of two long names
				continue
			}
			// An ID listed twice was put again while this List ran, or its
			// older version is not purged yet: the newer one counts.
			if i, ok := at[dl.ID]; ok {
				out = slices.Delete(out, i, i+1)
				for id, j := range at {
					if j > i {
						at[id] = j - 1
					}
				}
			}
			at[dl.ID] = len(out)
			out = append(out, dl)
		}
		if err := batch.Error(); err != nil && !errors.Is(err, jetstream.ErrNoMessages) {
			return nil, fmt.Errorf("natsjs: list dead letters: fetch: %w", err)
		}
		if err := ctx.Err(); err != nil {
			return nil, fmt.Errorf("natsjs: list dead letters: %w", err)
		}
		if n == 0 || pending == 0 || (f.Limit > 0 && len(out) >= f.Limit) {
			break
		}
	}
	if f.Limit > 0 && len(out) > f.Limit {
		out = out[:f.Limit]
	}
	return out, nil
}

// Delete removes the dead letters with the given IDs (every version of
// each); unknown IDs are ignored.
func (s *DeadLetterStore) Delete(ctx context.Context, ids ...string) error {
	if ctx == nil { // as the broker: nil is Background
		ctx = context.Background()
	}
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("natsjs: delete dead letters: %w", err)
	}
	for _, id := range ids {
		if err := s.stream.Purge(ctx, jetstream.WithPurgeSubject(s.idSubject(id))); err != nil {
			return fmt.Errorf("natsjs: delete dead letter %q: %w", id, err)
		}
	}
	return nil
}

// Len returns how many dead letters the stream holds.
func (s *DeadLetterStore) Len(ctx context.Context) (int, error) {
	if ctx == nil { // as the broker: nil is Background
		ctx = context.Background()
	}
	if err := ctx.Err(); err != nil {
		return 0, fmt.Errorf("natsjs: count dead letters: %w", err)
	}
	info, err := s.stream.Info(ctx)
	if err != nil {
		return 0, fmt.Errorf("natsjs: count dead letters: %w", err)
	}
	return int(info.State.Msgs), nil
}

// record is a dead letter as stored: JSON with field names of its own, so
// that renaming a Go field does not change what is on disk. Strings must be
// valid UTF-8 (JSON replaces invalid bytes with U+FFFD); Payload is bytes.
type record struct {
	Version    int           `json:"v"`
	ID         string        `json:"id"`
	Message    recordMessage `json:"message"`
	Subscriber string        `json:"subscriber"`
	Attempts   int           `json:"attempts"`
	ErrorCode  string        `json:"error_code"`
	Error      string        `json:"error"`
	Retryable  bool          `json:"retryable"`
	Reason     string        `json:"reason"`
	FailedAt   time.Time     `json:"failed_at"`
}

type recordMessage struct {
	ID          string            `json:"id"`
	Topic       string            `json:"topic"`
	Key         string            `json:"key,omitempty"`
	Payload     []byte            `json:"payload,omitempty"`
	Headers     map[string]string `json:"headers,omitempty"`
	Attempt     int               `json:"attempt"`
	PublishedAt time.Time         `json:"published_at"`
}

// recordVersion is the version of the encoding written.
const recordVersion = 1

func toRecord(dl *broker.DeadLetter) record {
	m := &dl.Message
	return record{
		Version: recordVersion, ID: dl.ID,
		Message: recordMessage{
			ID: m.ID, Topic: m.Topic, Key: m.Key, Payload: m.Payload, Headers: m.Headers,
			Attempt: m.Attempt, PublishedAt: m.PublishedAt,
		},
		Subscriber: dl.Subscriber, Attempts: dl.Attempts, ErrorCode: dl.ErrorCode, Error: dl.Error,
		Retryable: dl.Retryable, Reason: dl.Reason, FailedAt: dl.FailedAt,
	}
}

func decode(data []byte, seq uint64) (broker.DeadLetter, error) {
	var r record
	if err := json.Unmarshal(data, &r); err != nil {
		return broker.DeadLetter{}, fmt.Errorf("%w: stream sequence %d: %v", ErrCorrupt, seq, err)
	}
	if r.Version != recordVersion || r.ID == "" {
		return broker.DeadLetter{}, fmt.Errorf("%w: stream sequence %d: version %d, ID %q", ErrCorrupt, seq, r.Version, r.ID)
	}
	m := r.Message
	return broker.DeadLetter{
		ID: r.ID,
		Message: broker.Message{
			ID: m.ID, Topic: m.Topic, Key: m.Key, Payload: m.Payload, Headers: m.Headers,
			Attempt: m.Attempt, PublishedAt: m.PublishedAt,
		},
		Subscriber: r.Subscriber, Attempts: r.Attempts, ErrorCode: r.ErrorCode, Error: r.Error,
		Retryable: r.Retryable, Reason: r.Reason, FailedAt: r.FailedAt,
	}, nil
}

var _ broker.DeadLetterLister = (*DeadLetterStore)(nil)

// newestSkew is how much later than the server's clock a dead letter's
// FailedAt may be: ListNewest stops reading older messages once they were
// stored this long before q.Since.
const newestSkew = time.Minute

// ListNewest returns the dead letters matching q, newest first
// (broker.DeadLetterLister). It reads the stream backwards in windows of
// stream sequences, the first of listBatch and each next twice as wide,
// through temporary consumers the server filters by topic, subscriber
// and error code, and stops at q.Limit matches, at the stream's first
// message, or once the messages left were stored (by the server's clock)
// more than a minute before q.Since. So the newest page of a large
// stream costs about what it returns.
func (s *DeadLetterStore) ListNewest(ctx context.Context, q broker.DeadLetterQuery) ([]broker.DeadLetter, error) {
	if ctx == nil { // as the broker: nil is Background
		ctx = context.Background()
	}
	if err := ctx.Err(); err != nil {
		return nil, fmt.Errorf("natsjs: list newest dead letters: %w", err)
	}
	if err := q.Validate(); err != nil {
		return nil, fmt.Errorf("natsjs: list newest dead letters: %w", err)
	}
	info, err := s.stream.Info(ctx)
	if err != nil {
		return nil, fmt.Errorf("natsjs: list newest dead letters: %w", err)
	}
	st := info.State
	if st.Msgs == 0 {
		return nil, nil
	}
	var out []broker.DeadLetter
	seen := map[string]bool{} // IDs listed or skipped: the newest version counts
	window := uint64(listBatch)
	for end := st.LastSeq; ; window = min(2*window, 1<<16) {
		start := st.FirstSeq
		if end-st.FirstSeq >= window {
			start = end - window + 1
		}
		dls, stored, err := s.readRange(ctx, q.DeadLetterFilter, start, end)
		if err != nil {
			return nil, err
		}
		for i := len(dls) - 1; i >= 0; i-- {
			dl := dls[i]
			if seen[dl.ID] {
				continue
			}
			seen[dl.ID] = true
			if q.Match(dl) {
				out = append(out, dl)
				if q.Limit > 0 && len(out) == q.Limit {
					return out, nil
				}
			}
		}
		if start == st.FirstSeq || !q.Since.IsZero() && !stored.IsZero() && stored.Before(q.Since.Add(-newestSkew)) {
			return out, nil
		}
		end = start - 1
	}
}

// readRange returns the dead letters matching f stored at stream
// sequences start through end, oldest first, and when the first of them
// was stored (zero if none).
func (s *DeadLetterStore) readRange(ctx context.Context, f broker.DeadLetterFilter, start, end uint64) ([]broker.DeadLetter, time.Time, error) {
	cons, err := s.stream.CreateConsumer(ctx, jetstream.ConsumerConfig{
		Description:       "inproc broker: DeadLetterStore.ListNewest",
		FilterSubject:     s.filterSubject(f),
		DeliverPolicy:     jetstream.DeliverByStartSequencePolicy,
		OptStartSeq:       start,
		AckPolicy:         jetstream.AckNonePolicy,
		MemoryStorage:     true,
		Replicas:          1,
		InactiveThreshold: time.Minute, // the server removes it if ListNewest dies before deleting it
	})
	if err != nil {
		return nil, time.Time{}, fmt.Errorf("natsjs: list newest dead letters: consumer: %w", err)
	}
	defer func() {
		// Best effort: the InactiveThreshold removes it otherwise.
		_ = s.stream.DeleteConsumer(context.WithoutCancel(ctx), cons.CachedInfo().Name)
	}()
	var out []broker.DeadLetter
	var first time.Time
	if cons.CachedInfo().NumPending == 0 {
		return nil, first, nil
	}
	for {
		batch, err := cons.FetchNoWait(listBatch)
		if err != nil {
			return nil, first, fmt.Errorf("natsjs: list newest dead letters: fetch: %w", err)
		}
		n, pending, past := 0, uint64(1), false
		for msg := range batch.Messages() {
			n++
			meta, err := msg.Metadata()
			if err != nil {
				return nil, first, fmt.Errorf("natsjs: list newest dead letters: %w", err)
			}
			pending = meta.NumPending
			if meta.Sequence.Stream > end {
				past = true
				continue // read by an earlier window (the batch is drained)
			}
			if first.IsZero() {
				first = meta.Timestamp
			}
			dl, err := decode(msg.Data(), meta.Sequence.Stream)
			if err != nil {
				return nil, first, err
			}
			if f.Match(dl) { // only a SHA-256 collision of two long names fails it
				out = append(out, dl)
			}
		}
		if err := batch.Error(); err != nil && !errors.Is(err, jetstream.ErrNoMessages) {
			return nil, first, fmt.Errorf("natsjs: list newest dead letters: fetch: %w", err)
		}
		if err := ctx.Err(); err != nil {
			return nil, first, fmt.Errorf("natsjs: list newest dead letters: %w", err)
		}
		if n == 0 || pending == 0 || past {
			return out, first, nil
		}
	}
}
