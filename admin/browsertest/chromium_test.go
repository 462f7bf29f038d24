package browsertest_test

import (
	"fmt"
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/inproc/broker/admin/browsertest"
)

// writeFile writes a file with the given mode and returns its path.
func writeFile(t *testing.T, dir, name string, mode os.FileMode) string {
	t.Helper()
	p := filepath.Join(dir, name)
	require.NoError(t, os.WriteFile(p, []byte("#!/bin/sh\n"), mode))
	return p
}

// TestFindChromium covers where FindChromium looks and what it says when
// it finds nothing.
func TestFindChromium(t *testing.T) {
	dir := t.TempDir()
	exe := writeFile(t, dir, "my-chrome", 0o755)
	plain := writeFile(t, dir, "not-executable", 0o644)
	onPath := t.TempDir()
	second := writeFile(t, onPath, "chromium-browser", 0o755)
	empty := t.TempDir()

	tests := []struct {
		name     string
		chromium string // $CHROMIUM
		path     string // $PATH
		want     string // "" when it must fail
	}{
		{"CHROMIUM names an executable", exe, empty, exe},
		{"CHROMIUM wins over the PATH", exe, onPath, exe},
		{"CHROMIUM names nothing", filepath.Join(dir, "missing"), onPath, ""},
		{"CHROMIUM names a file that is not executable", plain, onPath, ""},
		{"CHROMIUM names a folder", dir, onPath, ""},
		{"found on the PATH", "", onPath, second},
		{"nothing on the PATH", "", empty, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Setenv(browsertest.EnvChromium, tt.chromium)
			t.Setenv("PATH", tt.path)
			got, err := browsertest.FindChromium()
			if tt.want != "" {
				require.NoError(t, err)
				assert.Equal(t, tt.want, got)
				return
			}
			require.ErrorIs(t, err, browsertest.ErrNoChromium)
			assert.Empty(t, got)
			assert.Contains(t, err.Error(), "install-chromium.sh", "the error says what to do")
			assert.Regexp(t, `^browsertest: no chromium found: `, err.Error())
		})
	}
}

// fakeTB records what Require asks of a test instead of ending it.
type fakeTB struct {
	testing.TB // nil: only the methods below may be called
	fatal      string
	skip       string
}

func (f *fakeTB) Helper()                           {}
func (f *fakeTB) Fatalf(format string, args ...any) { f.fatal = fmt.Sprintf(format, args...) }
func (f *fakeTB) Skipf(format string, args ...any)  { f.skip = fmt.Sprintf(format, args...) }

// TestRequire checks that a missing browser fails a test, naming
// install-chromium.sh, unless BROKER_SKIP_BROWSER=1 turns it into a skip.
func TestRequire(t *testing.T) {
	exe := writeFile(t, t.TempDir(), "chromium", 0o755)
	empty := t.TempDir()
	tests := []struct {
		name, path, skipEnv string
		want                string // path returned
		fails, skips        bool
	}{
		{"missing: fails", empty, "", "", true, false},
		{"missing, BROKER_SKIP_BROWSER=0: fails", empty, "0", "", true, false},
		{"missing, BROKER_SKIP_BROWSER=1: skips", empty, "1", "", false, true},
		{"found", filepath.Dir(exe), "", exe, false, false},
		{"found, BROKER_SKIP_BROWSER=1: runs", filepath.Dir(exe), "1", exe, false, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Setenv(browsertest.EnvChromium, "")
			t.Setenv("PATH", tt.path)
			t.Setenv(browsertest.EnvSkip, tt.skipEnv)
			f := &fakeTB{}
			assert.Equal(t, tt.want, browsertest.Require(f))
			assert.Equal(t, tt.fails, f.fatal != "", "failed: %q", f.fatal)
			assert.Equal(t, tt.skips, f.skip != "", "skipped: %q", f.skip)
			if tt.fails {
				assert.Contains(t, f.fatal, "install-chromium.sh")
				assert.Contains(t, f.fatal, browsertest.EnvSkip+"=1")
			}
		})
	}
}

// TestFlags checks the container flags: no GPU, no /dev/shm, a fixed window,
// and no sandbox only as root.
func TestFlags(t *testing.T) {
	user := browsertest.Flags(false)
	root := browsertest.Flags(true)
	for _, f := range []string{"disable-gpu", "disable-dev-shm-usage", "window-size=1440,900"} {
		assert.Contains(t, user, f)
		assert.Contains(t, root, f)
	}
	assert.NotContains(t, user, "no-sandbox")
	assert.Contains(t, root, "no-sandbox")
}
