package main

import (
	"io"
	"os"
	"slices"
	"strings"
	"testing"
)

// TestQuickstart runs the README's first program and checks what it
// prints (in any order: the two subscribers run at the same time).
func TestQuickstart(t *testing.T) {
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	stdout := os.Stdout
	os.Stdout = w
	main()
	os.Stdout = stdout
	w.Close()
	out, err := io.ReadAll(r)
	if err != nil {
		t.Fatal(err)
	}
	got := strings.Split(strings.TrimSpace(string(out)), "\n")
	want := []string{
		"billing: charged order-1 on attempt 1",
		"billing: charged order-2 on attempt 2",
		"billing: delivered 2, deduplicated 1, dead-lettered 0, retries 1",
		"dead letter: order-2 at email, reason permanent: permanent: no email address",
		"email: delivered 1, deduplicated 1, dead-lettered 1, retries 0",
		"email: sent confirmation of order-1 to ann@example.com",
	}
	slices.Sort(got)
	if !slices.Equal(got, want) {
		t.Errorf("quickstart printed (sorted):\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
}

// TestReadmeShowsQuickstart: the README's first Go program is this one,
// from "package main" on, so the program users copy is the one CI runs.
func TestReadmeShowsQuickstart(t *testing.T) {
	readme, err := os.ReadFile("../../README.md")
	if err != nil {
		t.Fatal(err)
	}
	src, err := os.ReadFile("main.go")
	if err != nil {
		t.Fatal(err)
	}
	_, body, ok := strings.Cut(string(src), "package main\n")
	if !ok {
		t.Fatal("main.go has no package clause")
	}
	_, block, ok := strings.Cut(string(readme), "```go\npackage main\n")
	if !ok {
		t.Fatal("README.md has no ```go block starting with package main")
	}
	block, _, _ = strings.Cut(block, "```\n")
	if block != body {
		t.Errorf("README.md's program differs from examples/quickstart/main.go:\nREADME:\n%s\nmain.go:\n%s", block, body)
	}
}
