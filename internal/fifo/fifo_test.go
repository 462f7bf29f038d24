package fifo

import (
	"fmt"
	"testing"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// The ring against a slice model, through growth and wrap-around.
func TestRingIsFIFO(t *testing.T) {
	var r Ring[int]
	var model []int
	next := 0
	for step := range 2000 {
		if step%89 == 88 { // an item put back in front
			r.PushFront(-step)
			model = append([]int{-step}, model...)
		} else if step%97 == 96 { // a batch, across the ring's end at times
			k := step % 7
			got := r.PopN(nil, k)
			want := model[:min(k, len(model))]
			if fmt.Sprint(got) != fmt.Sprint(want) {
				t.Fatalf("step %d: PopN(%d) = %v, want %v", step, k, got, want)
			}
			model = model[len(want):]
		} else if step%101 == 100 { // a look at a batch, which stays
			k := step % 11
			got := r.PeekN(nil, k)
			if want := model[:min(k, len(model))]; fmt.Sprint(got) != fmt.Sprint(want) {
				t.Fatalf("step %d: PeekN(%d) = %v, want %v", step, k, got, want)
			}
		} else if step%3 != 2 || len(model) == 0 {
			r.Push(next)
			model = append(model, next)
			next++
		} else {
			v, ok := r.Pop()
			if !ok || v != model[0] {
				t.Fatalf("step %d: Pop = %d, %v; want %d", step, v, ok, model[0])
			}
			model = model[1:]
		}
		if r.Len() != len(model) {
			t.Fatalf("step %d: Len = %d, want %d", step, r.Len(), len(model))
		}
		for i, want := range model {
			if got := *r.At(i); got != want {
				t.Fatalf("step %d: At(%d) = %d, want %d", step, i, got, want)
			}
		}
		if len(model) > 0 && *r.Front() != model[0] {
			t.Fatalf("step %d: Front = %d, want %d", step, *r.Front(), model[0])
		}
	}
	for len(model) > 0 {
		v, _ := r.Pop()
		if v != model[0] {
			t.Fatalf("drain: %d, want %d", v, model[0])
		}
		model = model[1:]
	}
	if _, ok := r.Pop(); ok || r.Front() != nil {
		t.Fatal("empty ring returned an item")
	}
}

// A ring with a Max grows to exactly Max slots and refuses a push past it.
func TestRingMax(t *testing.T) {
	for _, n := range []int{1, 5, 8, 100} {
		r := Ring[int]{Max: n}
		for i := range n {
			r.Push(i)
		}
		if len(r.buf) != n {
			t.Fatalf("Max %d: %d slots", n, len(r.buf))
		}
		func() {
			defer func() {
				if recover() == nil {
					t.Fatalf("Max %d: a push past it did not panic", n)
				}
			}()
			r.Push(n)
		}()
	}
}
