package natsjs_test

import (
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"

	"github.com/inproc/broker"
	"github.com/inproc/broker/natsjs"
)

func TestMaxDeadLettersEvictsOldest(t *testing.T) {
	js := embedded(t, "").JetStream()
	ctx := t.Context()
	s, err := natsjs.NewDeadLetterStore(ctx, js, natsjs.WithMaxDeadLetters(3))
	if err != nil {
		t.Fatalf("NewDeadLetterStore: %v", err)
	}
	for _, id := range []string{"a", "b", "c", "d", "e"} {
		if err := s.Put(ctx, broker.DeadLetter{ID: id, Message: broker.Message{ID: id, Topic: "t"}, Subscriber: "s"}); err != nil {
			t.Fatalf("Put(%s): %v", id, err)
		}
	}
	list, err := s.List(ctx, broker.DeadLetterFilter{})
	var ids []string
	for _, dl := range list {
		ids = append(ids, dl.ID)
	}
	if err != nil || !slices.Equal(ids, []string{"c", "d", "e"}) {
		t.Errorf("List = %q, %v; want the 3 newest", ids, err)
	}
}

func TestPutTooLarge(t *testing.T) {
	conn := embedded(t, "")
	s, err := natsjs.NewDeadLetterStore(t.Context(), conn.JetStream())
	if err != nil {
		t.Fatalf("NewDeadLetterStore: %v", err)
	}
	big := make([]byte, conn.NATS().MaxPayload()) // base64 in JSON: a third more
	err = s.Put(t.Context(), broker.DeadLetter{ID: "big", Message: broker.Message{ID: "m", Topic: "t", Payload: big}, Subscriber: "s"})
	if !errors.Is(err, natsjs.ErrTooLarge) || !errors.Is(err, broker.ErrDeadLetterRefused) {
		t.Errorf("Put of a %d-byte payload = %v, want ErrTooLarge", len(big), err)
	}
}

func TestLongNamesAreHashed(t *testing.T) {
	js := embedded(t, "").JetStream()
	ctx := t.Context()
	s, err := natsjs.NewDeadLetterStore(ctx, js)
	if err != nil {
		t.Fatalf("NewDeadLetterStore: %v", err)
	}
	long := strings.Repeat("topic-", 2000) // 12 KB: longer than a subject may be
	for _, id := range []string{long + "1", long + "2"} {
		if err := s.Put(ctx, broker.DeadLetter{ID: id, Message: broker.Message{ID: "m", Topic: long}, Subscriber: long, ErrorCode: long}); err != nil {
			t.Fatalf("Put with 12 KB names: %v", err)
		}
	}
	got, ok, err := s.Get(ctx, long+"2")
	if err != nil || !ok || got.ID != long+"2" || got.Message.Topic != long {
		t.Errorf("Get with a 12 KB ID = ok %v, err %v", ok, err)
	}
	list, err := s.List(ctx, broker.DeadLetterFilter{Topic: long, Subscriber: long, ErrorCode: long})
	if err != nil || len(list) != 2 {
		t.Errorf("List by 12 KB names = %d, %v; want 2", len(list), err)
	}
}

func TestCorruptMessageIsReported(t *testing.T) {
	js := embedded(t, "").JetStream()
	ctx := t.Context()
	s, err := natsjs.NewDeadLetterStore(ctx, js)
	if err != nil {
		t.Fatalf("NewDeadLetterStore: %v", err)
	}
	if _, err := js.Publish(ctx, natsjs.DefaultDeadLetterSubjectPrefix+".x.y.z.w", []byte("not json")); err != nil {
		t.Fatalf("Publish: %v", err)
	}
	if _, err := s.List(ctx, broker.DeadLetterFilter{}); !errors.Is(err, natsjs.ErrCorrupt) {
		t.Errorf("List over a foreign message = %v, want ErrCorrupt", err)
	}
}

func TestPutWithoutIDIsInvalid(t *testing.T) {
	s, err := natsjs.NewDeadLetterStore(t.Context(), embedded(t, "").JetStream())
	if err != nil {
		t.Fatalf("NewDeadLetterStore: %v", err)
	}
	if err := s.Put(t.Context(), broker.DeadLetter{}); !errors.Is(err, natsjs.ErrInvalidDeadLetter) {
		t.Errorf("Put without ID = %v, want ErrInvalidDeadLetter", err)
	}
}

// TestListAcrossBatches: List reads 256 dead letters per fetch; more than
// that come back whole, in order, filtered and limited.
func TestListAcrossBatches(t *testing.T) {
	s, err := natsjs.NewDeadLetterStore(t.Context(), embedded(t, "").JetStream())
	if err != nil {
		t.Fatalf("NewDeadLetterStore: %v", err)
	}
	ctx := t.Context()
	const n = 600
	var all, even []string
	for i := range n {
		id := fmt.Sprintf("dl-%04d", i)
		topic := []string{"even", "odd"}[i%2]
		if err := s.Put(ctx, broker.DeadLetter{ID: id, Message: broker.Message{ID: id, Topic: topic}, Subscriber: "s"}); err != nil {
			t.Fatalf("Put: %v", err)
		}
		all = append(all, id)
		if topic == "even" {
			even = append(even, id)
		}
	}
	for _, c := range []struct {
		name string
		f    broker.DeadLetterFilter
		want []string
	}{
		{"all", broker.DeadLetterFilter{}, all},
		{"filtered", broker.DeadLetterFilter{Topic: "even"}, even},
		{"limit across a batch", broker.DeadLetterFilter{Limit: 400}, all[:400]},
		{"filtered and limited", broker.DeadLetterFilter{Topic: "even", Limit: 290}, even[:290]},
	} {
		t.Run(c.name, func(t *testing.T) {
			list, err := s.List(ctx, c.f)
			if err != nil {
				t.Fatalf("List: %v", err)
			}
			got := make([]string, 0, len(list))
			for _, dl := range list {
				got = append(got, dl.ID)
			}
			if !slices.Equal(got, c.want) {
				t.Errorf("List(%+v) returned %d IDs, want %d in Put order", c.f, len(got), len(c.want))
			}
		})
	}
}
