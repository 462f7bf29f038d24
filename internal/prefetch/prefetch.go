// Package prefetch asks the processor to bring memory into cache ahead of
// use, without waiting for it: a hint, with no effect on what a program
// computes.
package prefetch

import "unsafe"

// Line hints that the cache line holding p will be read soon. It does not
// wait for the memory, unlike a load whose value is then thrown away.
func Line(p unsafe.Pointer) { line(uintptr(p)) }
