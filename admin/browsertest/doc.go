// Package browsertest holds the browser tests of the admin page
// (github.com/inproc/broker/admin): they serve the page over a real broker
// from an httptest.Server and drive headless Chromium through chromedp,
// clicking what a user clicks and reading the DOM the page builds.
//
// The package itself only finds and starts the browser the tests use:
// FindChromium looks for it, Flags lists the command-line flags it runs
// with (headless, suitable for containers), NewAllocator starts it under a
// context, and Require is what a test calls first. The tests live in the
// _test.go files; see README.md for what they prove and how to run them.
//
// A missing browser fails the tests, naming install-chromium.sh, unless
// the environment sets BROKER_SKIP_BROWSER=1 (EnvSkip).
package browsertest
