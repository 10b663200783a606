package memstore

import (
	"testing"
	"time"
)

var t0 = time.Date(2025, 6, 1, 12, 0, 0, 0, time.UTC)

func TestBucketRefillsContinuously(t *testing.T) {
	t.Parallel()
	const limit = 6000 // 100 tokens per second
	var b bucket
	if got := b.remaining(t0, limit); got != limit {
		t.Fatalf("zero bucket holds %d, want full %d", got, limit)
	}
	b.take(t0, limit, limit)

	steps := []struct {
		name          string
		at            time.Duration // since t0
		wantRemaining int64
		wantDebt      time.Duration
	}{
		{"empty right after", 0, 0, time.Minute},
		{"a tenth of a second earns 10", 100 * time.Millisecond, 10, 59900 * time.Millisecond},
		{"half a window earns half", 30 * time.Second, 3000, 30 * time.Second},
		{"a window refills completely", time.Minute, limit, 0},
		{"never above capacity", time.Hour, limit, 0},
	}
	for _, s := range steps {
		t.Run(s.name, func(t *testing.T) {
			now := t0.Add(s.at)
			if got := b.remaining(now, limit); got != s.wantRemaining {
				t.Errorf("remaining = %d, want %d", got, s.wantRemaining)
			}
			if got := b.debt(now); got != s.wantDebt {
				t.Errorf("debt = %v, want %v", got, s.wantDebt)
			}
		})
	}
}

func TestBucketWaitIsExact(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name     string
		limit    int64
		drain    int64 // taken at t0
		need     int64
		wantWait time.Duration
	}{
		{"even rate", 6000, 6000, 250, 2500 * time.Millisecond},
		{"uneven rate", 7, 7, 3, 25_714_285_715},
		{"partly available", 6000, 5900, 250, 1500 * time.Millisecond},
		{"available now", 6000, 100, 250, 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			var b bucket
			b.take(t0, tt.drain, tt.limit)
			wait := b.wait(t0, tt.need, tt.limit)
			if wait != tt.wantWait {
				t.Fatalf("wait = %v, want %v", wait, tt.wantWait)
			}
			if wait == 0 {
				return
			}
			if got := b.wait(t0.Add(wait-1), tt.need, tt.limit); got != 1 {
				t.Errorf("one nanosecond early: wait = %v, want 1ns", got)
			}
			if got := b.wait(t0.Add(wait), tt.need, tt.limit); got != 0 {
				t.Errorf("at the promised time: wait = %v, want 0", got)
			}
			if got := b.remaining(t0.Add(wait), tt.limit); got < tt.need {
				t.Errorf("at the promised time: remaining = %d, want at least %d", got, tt.need)
			}
		})
	}
}

func TestBucketTakeNegativeRefundsUpToCapacity(t *testing.T) {
	t.Parallel()
	const limit = 6000
	var b bucket
	b.take(t0, 1000, limit)
	b.take(t0, -400, limit)
	if got := b.remaining(t0, limit); got != 5400 {
		t.Errorf("after refunding 400 of 1000: remaining = %d, want 5400", got)
	}
	b.take(t0, -10_000, limit)
	if got := b.remaining(t0, limit); got != limit {
		t.Errorf("after refunding too much: remaining = %d, want capacity %d", got, limit)
	}
	b.take(t0, 3*limit, limit) // overdraw by two windows
	if got, want := b.debt(t0), 3*time.Minute; got != want {
		t.Errorf("overdrawn: debt = %v, want %v", got, want)
	}
	if got := b.remaining(t0.Add(2*time.Minute), limit); got != 0 {
		t.Errorf("still in debt after 2m: remaining = %d, want 0", got)
	}
}
