package browsertest_test

import (
	"context"
	"fmt"
	"log"
	"net/http"
	"net/http/httptest"

	"github.com/chromedp/chromedp"

	"github.com/inproc/broker"
	"github.com/inproc/broker/admin"
	"github.com/inproc/broker/admin/browsertest"
)

// The flags the browser runs with, on top of chromedp's defaults, when the
// tests run as root (in a container, say).
func ExampleFlags() {
	for _, f := range browsertest.Flags(true) {
		fmt.Println("--" + f)
	}
	// Output:
	// --disable-gpu
	// --disable-dev-shm-usage
	// --window-size=1440,900
	// --lang=en-US
	// --no-sandbox
}

// Open the admin page of a broker in headless Chromium and read what it
// shows. (Not run by go test: it needs the browser; the tests use Require.)
func ExampleNewAllocator() {
	path, err := browsertest.FindChromium()
	if err != nil {
		log.Fatal(err) // says to run install-chromium.sh
	}
	b, err := broker.New()
	if err != nil {
		log.Fatal(err)
	}
	defer b.Close(context.Background())
	h, err := admin.New(b, admin.Options{})
	if err != nil {
		log.Fatal(err)
	}
	defer h.Close()
	mux := http.NewServeMux()
	mux.Handle("/admin/", http.StripPrefix("/admin", h))
	srv := httptest.NewServer(mux)
	defer srv.Close()

	alloc, cancelAlloc := browsertest.NewAllocator(context.Background(), path)
	defer cancelAlloc()
	ctx, cancel := chromedp.NewContext(alloc)
	defer cancel()
	if err := chromedp.Do(ctx, chromedp.Navigate(srv.URL+"/admin/")); err != nil {
		log.Fatal(err)
	}
	mode, err := chromedp.Run(ctx, chromedp.Text(chromedp.CSS("#mode")))
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println(mode)
}
