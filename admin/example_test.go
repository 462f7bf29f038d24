package admin_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"time"

	"github.com/inproc/broker"
	"github.com/inproc/broker/admin"
)

// Mount the admin page under /admin/ of a service's mux. Put your own
// authentication in front of it; AllowActions enables redrive and delete.
func Example() {
	quiet := slog.New(slog.DiscardHandler)
	b, err := broker.New(broker.WithLogger(quiet))
	if err != nil {
		panic(err)
	}
	defer b.Close(context.Background())
	_, _ = b.Subscribe("order.created", "mailer", func(ctx context.Context, m broker.Message) error {
		return broker.Permanent(errors.New("invalid address"))
	})
	_ = b.Publish(context.Background(), broker.Message{ID: "order-1001", Topic: "order.created"})

	h, err := admin.New(b, admin.Options{AllowActions: true, Title: "orders service", Logger: quiet})
	if err != nil {
		panic(err)
	}
	defer h.Close()
	mux := http.NewServeMux()
	mux.Handle("/admin/", http.StripPrefix("/admin", h))
	// In a service: http.ListenAndServe(addr, authenticate(mux)).

	// Here, a script reads the dead letters as JSON once the first one is in.
	for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(time.Millisecond) {
		if n, _ := b.DeadLetters().Len(context.Background()); n > 0 {
			break
		}
	}
	w := httptest.NewRecorder()
	mux.ServeHTTP(w, httptest.NewRequest("GET", "/admin/api/deadletters?topic=order.created", nil))
	var list admin.DeadLetterList
	if err := json.NewDecoder(w.Body).Decode(&list); err != nil {
		panic(err)
	}
	fmt.Println(w.Code, w.Header().Get("Content-Type"))
	for _, dl := range list.DeadLetters {
		fmt.Println(dl.MessageID, dl.Subscriber, dl.ErrorCode, dl.Reason, dl.Error)
	}
	// Output:
	// 200 application/json; charset=utf-8
	// order-1001 mailer permanent permanent permanent: invalid address
}
