package natsjs

import (
	"errors"
	"fmt"
	"maps"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/inproc/broker"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// Headers of a message in a topic's stream. The payload is the data, as
// published; the broker's fields travel in headers, each value as it is
// when it is printable ASCII without surrounding spaces or a leading '"',
// else quoted (strconv.QuoteToASCII), so that any string survives exactly.
const (
	hdrID          = "Broker-Id"           // Message.ID
	hdrKey         = "Broker-Key"          // Message.Key, absent when empty
	hdrPublishedAt = "Broker-Published-At" // Message.PublishedAt, RFC 3339 with nanoseconds, UTC
	// hdrHeaders carries Message.Headers, absent when empty:
	// "name":"value" pairs separated by commas, each string quoted
	// (strconv.QuoteToASCII), so that it reads as JSON for plain text.
	hdrHeaders = "Broker-Headers"
	// hdrRedrive marks a copy published by Redrive; its value is the dead
	// letter's ID.
	hdrRedrive = "Broker-Redrive"
)

// headerValue returns s as a header value: s itself when it is printable
// ASCII, not empty, without a leading or trailing space and not starting
// with '"'; else s quoted.
func headerValue(s string) string {
	if plainHeaderValue(s) {
		return s
	}
	return strconv.QuoteToASCII(s)
}

func plainHeaderValue(s string) bool {
	if s == "" || s[0] == '"' || s[0] == ' ' || s[len(s)-1] == ' ' {
		return false
	}
	for i := 0; i < len(s); i++ {
		if s[i] < 0x20 || s[i] > 0x7e {
			return false
		}
	}
	return true
}

// parseHeaderValue undoes headerValue.
func parseHeaderValue(v string) (string, error) {
	if !strings.HasPrefix(v, `"`) {
		return v, nil
	}
	return strconv.Unquote(v)
}

// encodeHeader returns the headers that carry msg's fields.
func encodeHeader(msg *broker.Message) nats.Header {
	h := make(nats.Header, 4)
	h.Set(hdrID, headerValue(msg.ID))
	if msg.Key != "" {
		h.Set(hdrKey, headerValue(msg.Key))
	}
	if !msg.PublishedAt.IsZero() {
		h.Set(hdrPublishedAt, msg.PublishedAt.UTC().Format(time.RFC3339Nano))
	}
	if len(msg.Headers) > 0 {
		h.Set(hdrHeaders, encodeUserHeaders(msg.Headers))
	}
	return h
}

func encodeUserHeaders(hs map[string]string) string {
	var b strings.Builder
	for i, k := range slices.Sorted(maps.Keys(hs)) {
		if i > 0 {
			b.WriteByte(',')
		}
		b.WriteString(strconv.QuoteToASCII(k))
		b.WriteByte(':')
		b.WriteString(strconv.QuoteToASCII(hs[k]))
	}
	return b.String()
}

func decodeUserHeaders(s string) (map[string]string, error) {
	hs := make(map[string]string)
	for s != "" {
		k, rest, err := nextQuoted(s)
		if err != nil {
			return nil, err
		}
		if !strings.HasPrefix(rest, ":") {
			return nil, errors.New("missing ':' after a header name")
		}
		v, rest, err := nextQuoted(rest[1:])
		if err != nil {
			return nil, err
		}
		hs[k] = v
		s = rest
		if s != "" {
			if s[0] != ',' {
				return nil, errors.New("missing ',' between headers")
			}
			if s = s[1:]; s == "" {
				return nil, errors.New("a ',' ends the headers")
			}
		}
	}
	return hs, nil
}

func nextQuoted(s string) (string, string, error) {
	q, err := strconv.QuotedPrefix(s)
	if err != nil {
		return "", "", err
	}
	v, err := strconv.Unquote(q)
	return v, s[len(q):], err
}

// decodeMessage rebuilds the broker's message from m. A message published
// on a topic's subject by another NATS client (no broker headers) is
// still delivered: its ID is its Nats-Msg-Id, or "<stream>.<sequence>.<stored
// at, Unix ns>", and its PublishedAt when the stream stored it. Undecodable broker
// headers are reported in err, the rest of the message filled in.
func decodeMessage(topic string, m *nats.Msg, meta *nats.MsgMetadata) (msg broker.Message, redriven bool, err error) {
	h := m.Header
	msg = broker.Message{Topic: topic, Payload: m.Data, Attempt: int(min(meta.NumDelivered, 1<<31-1))}
	var errs []error
	field := func(name string) string {
		v, err := parseHeaderValue(h.Get(name))
		if err != nil {
			errs = append(errs, fmt.Errorf("%s: %w", name, err))
		}
		return v
	}
	msg.ID = field(hdrID)
	if msg.ID == "" {
		msg.ID = field(jetstream.MsgIDHeader)
	}
	if msg.ID == "" { // with the stored time: sequences start again with a new stream
		msg.ID = meta.Stream + "." + strconv.FormatUint(meta.Sequence.Stream, 10) + "." + strconv.FormatInt(meta.Timestamp.UnixNano(), 10)
	}
	msg.Key = field(hdrKey)
	msg.PublishedAt = meta.Timestamp
	if v := h.Get(hdrPublishedAt); v != "" {
		if at, err := time.Parse(time.RFC3339Nano, v); err == nil {
			msg.PublishedAt = at
		} else {
			errs = append(errs, fmt.Errorf("%s: %w", hdrPublishedAt, err))
		}
	}
	if v := h.Get(hdrHeaders); v != "" {
		if hs, err := decodeUserHeaders(v); err == nil {
			msg.Headers = hs
		} else {
			errs = append(errs, fmt.Errorf("%s: %w", hdrHeaders, err))
		}
	}
	_, redriven = h[hdrRedrive]
	return msg, redriven, errors.Join(errs...)
}

// delivery is one delivery of a message to a subscriber: a broker.Delivery
// whose outcomes are the JetStream acknowledgements, published to the
// message's reply subject.
type delivery struct {
	nc       *nats.Conn
	reply    string // the message's $JS.ACK subject
	msg      broker.Message
	redriven bool
	dlID     string
	legacyID string // "": no legacy dead letter to look for (see legacyDeadLetterID)
	every    time.Duration
	check    bool // look its dead letter up before running it (see partitionLoop.handle)

	// For one end state when two deliveries of the message overlap (see
	// Ack and Terminate).
	l           *partitionLoop
	redelivered bool      // NumDelivered > 1
	arrived     time.Time // when the loop got it
	reconnects  uint64    // the connection's reconnections then
}

var (
	_ broker.Delivery       = (*delivery)(nil)
	_ broker.DeadLetterIDer = (*delivery)(nil)
)

// Message returns the message, Attempt the server's delivery count.
func (d *delivery) Message() broker.Message { return d.msg }

// Redriven reports a copy published by Redrive.
func (d *delivery) Redriven() bool { return d.redriven }

// Ack acknowledges the message: it is done at this subscriber. A delivery
// that may have overlapped another one of the message (the connection was
// lost or reconnected since it arrived, or it was held for longer than the
// AckWait: either way the server may have delivered it again, to another
// process) then looks the message's dead letter up and deletes it: the
// message was delivered, here.
func (d *delivery) Ack() error {
	err := d.nc.Publish(d.reply, []byte("+ACK"))
	if d.l != nil && d.mayOverlap() {
		d.l.dropDeadLetter(d, "natsjs: a message delivered here was dead-lettered by another delivery of it meanwhile (the server delivered it again during a reconnection or a long hold); its dead letter is deleted")
	}
	return err
}

// mayOverlap reports whether the server may have delivered d's message
// again while d was held here: its keep-alives could not reach the server
// (a disconnection or reconnection since d arrived) or it was held for an
// AckWait or more.
func (d *delivery) mayOverlap() bool {
	return !d.nc.IsConnected() || d.nc.Stats().Reconnects != d.reconnects || time.Since(d.arrived) >= 3*d.every
}

// minNakDelay is the shortest delay Retry asks for. The server records
// the time of a Nak that has a delay in the consumer's stored state, but
// only queues a plain Nak in memory: a message handed back at once (Close
// cut its handler off) would wait out its whole AckWait after a restart.
const minNakDelay = time.Millisecond

// Retry asks the server to deliver the message again after delay (at
// least minNakDelay: at once, in effect); the partition waits meanwhile.
func (d *delivery) Retry(delay time.Duration) error {
	return d.nc.Publish(d.reply, fmt.Appendf(nil, `-NAK {"delay": %d}`, max(delay, minNakDelay).Nanoseconds()))
}

// Terminate tells the server never to deliver the message again, with the
// reason (it appears in the server's terminated-message advisory). The
// broker calls it after storing the dead letter. For a message delivered
// before (not redriven), the idempotency store is asked first
// (WithDedupCheck) whether another delivery of it succeeded meanwhile: if
// so the dead letter just stored is deleted, and the message ends
// delivered.
func (d *delivery) Terminate(reason string) error {
	if d.l != nil && d.redelivered && !d.redriven && d.l.deliveredElsewhere(d) {
		d.l.dropDeadLetter(d, "natsjs: a message dead-lettered here was delivered by another delivery of it meanwhile (the server delivered it again during a reconnection); its dead letter is deleted")
	}
	return d.term(reason)
}

// term sends the termination.
func (d *delivery) term(reason string) error {
	return d.nc.Publish(d.reply, []byte("+TERM "+reason))
}

// KeepAliveEvery is a third of the consumer's AckWait.
func (d *delivery) KeepAliveEvery() time.Duration { return d.every }

// KeepAlive tells the server the handler still runs (+WPI), which restarts
// its AckWait.
func (d *delivery) KeepAlive() error { return d.nc.Publish(d.reply, []byte("+WPI")) }

// DeadLetterID is "<stream>.<stream sequence>.<stored at>.<subscriber>",
// the time the stream stored the message in Unix nanoseconds: the same for
// every delivery of one stored message to one subscriber, so that a dead
// letter written again after a crash replaces the first, and different for
// a message stored at the same sequence later (a memory stream after a
// server restart, a stream deleted and created again start at 1 again).
func (d *delivery) DeadLetterID() string { return d.dlID }

// deadLetterID is the dead-letter ID of the message stored at seq in
// stream at stored (unix ns), for subscriber sub.
func deadLetterID(stream string, seq uint64, stored time.Time, sub string) string {
	return stream + "." + strconv.FormatUint(seq, 10) + "." + strconv.FormatInt(stored.UnixNano(), 10) + "." + sub
}

// legacyDeadLetterID is the ID versions before the stored time was part of
// it gave the same dead letter: "<stream>.<sequence>.<subscriber>". It names
// every message stored at seq in any life of the stream, so a dead letter
// found under it is only trusted when it is this message's (see
// partitionLoop.deadLettered).
func legacyDeadLetterID(stream string, seq uint64, sub string) string {
	return stream + "." + strconv.FormatUint(seq, 10) + "." + sub
}
