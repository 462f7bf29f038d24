package browsertest

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"testing"

	"github.com/chromedp/chromedp"
)

// Environment variables the package and its tests read.
const (
	// EnvChromium names the browser binary to use instead of looking for
	// one on the PATH.
	EnvChromium = "CHROMIUM"
	// EnvSkip set to "1" makes Require skip the test when no browser is
	// found, instead of failing it.
	EnvSkip = "BROKER_SKIP_BROWSER"
	// EnvScreenshots set to "1" makes the screenshot test write its PNG
	// files into the repository's docs folder instead of a temporary one.
	EnvScreenshots = "BROKER_SCREENSHOTS"
)

// ErrNoChromium is wrapped by the error FindChromium returns when there is
// no browser to run.
var ErrNoChromium = errors.New("browsertest: no chromium found")

// chromiumNames are the binaries FindChromium looks for on the PATH, in
// order: Debian's and Ubuntu's Chromium, then Google Chrome.
var chromiumNames = []string{"chromium", "chromium-browser", "google-chrome", "google-chrome-stable"}

// installHint says what to do about a missing browser.
const installHint = "run admin/browsertest/install-chromium.sh (Debian's chromium package), " +
	"or set " + EnvChromium + " to a Chromium or Chrome binary"

// FindChromium returns the path of the browser the tests drive: the file
// that $CHROMIUM names when it is set, else the first of chromium,
// chromium-browser, google-chrome and google-chrome-stable found on the
// PATH. It fails with an error wrapping ErrNoChromium, saying to run
// install-chromium.sh, when there is none (or $CHROMIUM names no
// executable file).
func FindChromium() (string, error) {
	if p := os.Getenv(EnvChromium); p != "" {
		st, err := os.Stat(p)
		switch {
		case err != nil:
			return "", fmt.Errorf("%w: %s=%q: %v; %s", ErrNoChromium, EnvChromium, p, err, installHint)
		case st.IsDir() || st.Mode().Perm()&0o111 == 0:
			return "", fmt.Errorf("%w: %s=%q is not an executable file; %s", ErrNoChromium, EnvChromium, p, installHint)
		}
		return p, nil
	}
	for _, name := range chromiumNames {
		if p, err := exec.LookPath(name); err == nil {
			return p, nil
		}
	}
	return "", fmt.Errorf("%w: none of %s on the PATH; %s", ErrNoChromium, strings.Join(chromiumNames, ", "), installHint)
}

// Flags returns the command-line flags, without their leading "--", that
// NewAllocator adds to chromedp's defaults (which already run headless
// with a blank first page, no first-run dialogs and no background
// networking): no GPU, shared memory in the temporary directory rather
// than a small container /dev/shm, a fixed window size so that layouts and
// screenshots do not depend on the machine, and, when asRoot, no sandbox
// (Chromium refuses to start as root with one).
func Flags(asRoot bool) []string {
	f := []string{"disable-gpu", "disable-dev-shm-usage", "window-size=1440,900", "lang=en-US"}
	if asRoot {
		f = append(f, "no-sandbox")
	}
	return f
}

// NewAllocator returns a chromedp allocator context that starts the browser
// at execPath with chromedp's default options plus Flags (asRoot when the
// process runs as root). Pass it to chromedp.NewContext; the browser starts
// at the first action and ends when the allocator's cancel returns, which
// waits for the process and its temporary profile directory to go.
func NewAllocator(parent context.Context, execPath string) (context.Context, context.CancelFunc) {
	opts := append([]chromedp.ExecAllocatorOption(nil), chromedp.DefaultExecAllocatorOptions[:]...)
	opts = append(opts, chromedp.ExecPath(execPath))
	for _, f := range Flags(os.Geteuid() == 0) {
		name, value, ok := strings.Cut(f, "=")
		if ok {
			opts = append(opts, chromedp.Flag(name, value))
		} else {
			opts = append(opts, chromedp.Flag(name, true))
		}
	}
	return chromedp.NewExecAllocator(parent, opts...)
}

// Require returns the browser's path for a test that needs it. When there
// is none it fails the test with FindChromium's error, which names
// install-chromium.sh, or skips it when the environment sets EnvSkip to
// "1".
func Require(t testing.TB) string {
	t.Helper()
	p, err := FindChromium()
	if err == nil {
		return p
	}
	if os.Getenv(EnvSkip) == "1" {
		t.Skipf("%s=1: skipping: %v", EnvSkip, err)
		return ""
	}
	t.Fatalf("%v (or set %s=1 to skip the browser tests)", err, EnvSkip)
	return ""
}
