// Package fifo provides a plain first-in, first-out buffer: a ring that
// grows by doubling and is not safe for concurrent use (its owner holds a
// lock). A topic queue keeps its messages in one, a subscriber's lane its
// ready messages and each held key's waiting messages.
package fifo

// minSize is the ring size of the first push.
const minSize = 8

// Ring is a FIFO of T. The zero value is empty and ready to use.
type Ring[T any] struct {
	// Max, when above 0, is the most items the ring grows to hold: its
	// owner pushes no more (a push past it panics).
	Max  int
	buf  []T
	head int // index of the oldest item
	n    int // items held
}

// Len returns how many items the ring holds.
func (r *Ring[T]) Len() int { return r.n }

// Push appends v.
func (r *Ring[T]) Push(v T) { *r.Append() = v }

// PushFront puts v before the oldest item.
func (r *Ring[T]) PushFront(v T) {
	if r.n == len(r.buf) {
		r.grow()
	}
	r.head = r.index(len(r.buf) - 1) // one back, around the ring
	r.buf[r.head] = v
	r.n++
}

// Append appends a zero item and returns a pointer to it, valid until the
// next Push, Append or Pop, to fill in place.
func (r *Ring[T]) Append() *T {
	if r.n == len(r.buf) {
		r.grow()
	}
	p := &r.buf[r.index(r.n)]
	r.n++
	return p
}

// Pop removes and returns the oldest item; ok is false when the ring is
// empty.
func (r *Ring[T]) Pop() (v T, ok bool) {
	if r.n == 0 {
		return v, false
	}
	v = r.buf[r.head]
	var zero T
	r.buf[r.head] = zero // drop references for the garbage collector
	r.head = r.index(1)
	r.n--
	return v, true
}

// PopN removes up to k of the oldest items and appends them to dst, in
// order, copying each item once.
func (r *Ring[T]) PopN(dst []T, k int) []T {
	dst = r.PeekN(dst, k)
	r.DropN(k)
	return dst
}

// PeekN appends up to k of the oldest items to dst, in order, and leaves
// them in the ring.
func (r *Ring[T]) PeekN(dst []T, k int) []T {
	k = min(k, r.n)
	first := r.buf[r.head:min(r.head+k, len(r.buf))]
	return append(append(dst, first...), r.buf[:k-len(first)]...) // the rest, past the ring's end
}

// DropN removes up to k of the oldest items.
func (r *Ring[T]) DropN(k int) {
	for k = min(k, r.n); k > 0; {
		seg := r.buf[r.head:min(r.head+k, len(r.buf))]
		clear(seg) // drop references for the garbage collector
		r.head = r.index(len(seg))
		r.n -= len(seg)
		k -= len(seg)
	}
}

// Front returns a pointer to the oldest item, valid until the next Push or
// Pop; nil when the ring is empty.
func (r *Ring[T]) Front() *T {
	if r.n == 0 {
		return nil
	}
	return &r.buf[r.head]
}

// At returns a pointer to item i (0 is the oldest), valid until the next
// Push or Pop. It panics if i is out of range, like a slice index.
func (r *Ring[T]) At(i int) *T {
	if i < 0 || i >= r.n {
		panic("fifo: index out of range")
	}
	return &r.buf[r.index(i)]
}

func (r *Ring[T]) index(i int) int {
	i += r.head
	if i >= len(r.buf) {
		i -= len(r.buf)
	}
	return i
}

func (r *Ring[T]) grow() {
	size := max(2*len(r.buf), minSize)
	if r.Max > 0 {
		size = min(size, r.Max)
	}
	if size == len(r.buf) {
		panic("fifo: push past Max")
	}
	nb := make([]T, size)
	k := copy(nb, r.buf[r.head:])
	copy(nb[k:], r.buf[:r.head])
	r.buf, r.head = nb, 0
}
