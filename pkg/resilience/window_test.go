package resilience

import (
	"testing"
	"time"

	"github.com/jonboulle/clockwork"
	"pgregory.net/rapid"
)

func TestNewWindowRejectsBadShapes(t *testing.T) {
	tests := []struct {
		name            string
		length          time.Duration
		buckets, fields int
	}{
		{"no buckets", time.Minute, 0, 1},
		{"no fields", time.Minute, 12, 0},
		{"length shorter than buckets", 5 * time.Nanosecond, 12, 1},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if _, err := NewWindow(tt.length, tt.buckets, tt.fields, clockwork.NewFakeClock()); err == nil {
				t.Fatal("NewWindow: want an error, got nil")
			}
		})
	}
}

// TestWindowSlides checks which adds a Sum still sees as the clock advances: a 60 s window of
// 12 buckets keeps an add for 55 s to 60 s depending on where in its bucket it landed.
func TestWindowSlides(t *testing.T) {
	tests := []struct {
		name       string
		addAt      time.Duration // offset from the window's creation
		sumAt      time.Duration
		want       int
		wantLength time.Duration
	}{
		{"same instant", 0, 0, 1, time.Minute},
		{"end of the first bucket", 0, 4999 * time.Millisecond, 1, time.Minute},
		{"last bucket still in", 0, 59999 * time.Millisecond, 1, time.Minute},
		{"slid out after a full window", 0, 60 * time.Second, 0, time.Minute},
		{"added late in its bucket, slides out with it", 4 * time.Second, 60 * time.Second, 0, time.Minute},
		{"added at a bucket start, kept a full window", 5 * time.Second, 64 * time.Second, 1, time.Minute},
		{"long gap", 0, time.Hour, 0, time.Minute},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			clock := clockwork.NewFakeClock()
			w, err := NewWindow(time.Minute, 12, 2, clock)
			if err != nil {
				t.Fatal(err)
			}
			clock.Advance(tt.addAt)
			w.Add(1, 1)
			clock.Advance(tt.sumAt - tt.addAt)
			if got := w.Sum(1); got != tt.want {
				t.Errorf("Sum(1) = %d, want %d", got, tt.want)
			}
			if got := w.Sum(0); got != 0 {
				t.Errorf("Sum(0) = %d, want 0 (fields are separate)", got)
			}
			if got := w.Length(); got != tt.wantLength {
				t.Errorf("Length() = %s, want %s", got, tt.wantLength)
			}
		})
	}
}

func TestWindowRecyclesSlotsAndResets(t *testing.T) {
	clock := clockwork.NewFakeClock()
	w, err := NewWindow(time.Minute, 12, 1, clock)
	if err != nil {
		t.Fatal(err)
	}
	w.Add(0, 5)
	clock.Advance(time.Minute) // same slot, next lap: the old count must not leak in
	w.Add(0, 2)
	if got := w.Sum(0); got != 2 {
		t.Fatalf("after a lap: Sum = %d, want 2", got)
	}
	w.Reset()
	if got := w.Sum(0); got != 0 {
		t.Fatalf("after Reset: Sum = %d, want 0", got)
	}
}

// TestWindowMatchesModel compares the window with a list of timestamped events: an event
// counts while its bucket is one of the last Buckets buckets.
func TestWindowMatchesModel(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		buckets := rapid.IntRange(1, 16).Draw(t, "buckets")
		width := time.Duration(rapid.IntRange(1, 10).Draw(t, "width_s")) * time.Second
		clock := clockwork.NewFakeClock()
		origin := clock.Now()
		w, err := NewWindow(width*time.Duration(buckets), buckets, 2, clock)
		if err != nil {
			t.Fatal(err)
		}
		type event struct {
			epoch int64
			field int
		}
		var events []event
		epoch := func() int64 { return int64(clock.Since(origin) / width) }
		for i := range rapid.IntRange(1, 200).Draw(t, "steps") {
			if rapid.Bool().Draw(t, "advance") {
				clock.Advance(time.Duration(rapid.Int64Range(0, int64(3*width)).Draw(t, "d")))
				continue
			}
			f := rapid.IntRange(0, 1).Draw(t, "field")
			w.Add(f, 1)
			events = append(events, event{epoch(), f})
			sums := w.SumsAt(clock.Now(), make([]int, 2))
			for field := range 2 {
				want := 0
				for _, e := range events {
					if e.field == field && e.epoch > epoch()-int64(buckets) {
						want++
					}
				}
				if got := w.Sum(field); got != want {
					t.Fatalf("step %d: Sum(%d) = %d, model %d", i, field, got, want)
				}
				if sums[field] != want {
					t.Fatalf("step %d: SumsAt[%d] = %d, model %d", i, field, sums[field], want)
				}
			}
		}
	})
}
