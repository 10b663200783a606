package session

import (
	"fmt"
	"testing"
	"time"
)

func TestSchedulerCap(t *testing.T) {
	cfg := SchedulerConfig{ParallelCap: 4, TimeoutRate: 0.5, MinCalls: 4, Window: time.Minute}
	// An event is calls of tool "slow" (the last timeouts of them timed out) at an offset from the
	// start, then the cap a session that called "slow" gets.
	type event struct {
		at              time.Duration
		calls, timeouts int
		want            int
	}
	tests := []struct {
		name   string
		events []event
	}{
		{"no timeouts keep the cap", []event{
			{at: 0, calls: 20, want: 4},
			{at: 5 * time.Minute, calls: 20, want: 4},
		}},
		{"too few calls do not count", []event{
			{at: 0, calls: 3, timeouts: 3, want: 4},
		}},
		{"a rate below the threshold keeps the cap", []event{
			{at: 0, calls: 10, timeouts: 4, want: 4},
		}},
		{"timeouts halve the cap at once, then go serial the next window", []event{
			{at: 0, calls: 4, timeouts: 2, want: 2},
			{at: 10 * time.Second, calls: 4, timeouts: 4, want: 2}, // one step per window
			{at: time.Minute, calls: 4, timeouts: 4, want: 1},
			{at: 2 * time.Minute, calls: 4, timeouts: 4, want: 1}, // serial is the floor
		}},
		{"quiet windows step the cap back up one level each", []event{
			{at: 0, calls: 4, timeouts: 4, want: 2},
			{at: time.Minute, calls: 4, timeouts: 4, want: 1},
			{at: 2 * time.Minute, calls: 4, want: 1},             // this window is quiet so far
			{at: 3 * time.Minute, calls: 4, want: 2},             // ...and it ended quiet
			{at: 4*time.Minute + time.Second, calls: 0, want: 4}, // the next one too
		}},
		{"a window with a timeout below the rate does not recover", []event{
			{at: 0, calls: 4, timeouts: 4, want: 2},
			{at: time.Minute, calls: 10, timeouts: 1, want: 2},
			{at: 2 * time.Minute, calls: 1, want: 2},
			{at: 3 * time.Minute, want: 4},
		}},
		{"an idle tool recovers", []event{
			{at: 0, calls: 4, timeouts: 4, want: 2},
			{at: time.Minute, calls: 4, timeouts: 4, want: 1},
			{at: time.Hour, want: 4},
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s := NewScheduler(cfg)
			for i, e := range tt.events {
				now := epoch.Add(e.at)
				for c := range e.calls {
					s.Record("slow", c >= e.calls-e.timeouts, now)
				}
				if got := s.Cap(now, "fast", "slow"); got != e.want {
					t.Fatalf("event %d (%+v): cap %d, want %d", i, e, got, e.want)
				}
				if got := s.Cap(now, "fast"); got != cfg.ParallelCap {
					t.Fatalf("event %d: a session that never called slow has cap %d, want %d", i, got, cfg.ParallelCap)
				}
			}
		})
	}
}

func TestSchedulerBound(t *testing.T) {
	s := NewScheduler(SchedulerConfig{ParallelCap: 4, TimeoutRate: 0.5, MinCalls: 1, Window: time.Minute})
	for i := range maxSchedulerTools + 10 {
		s.Record(fmt.Sprintf("tool-%d", i), true, epoch.Add(time.Duration(i)*time.Millisecond))
	}
	if n := len(s.tools); n != maxSchedulerTools {
		t.Fatalf("tracked %d tools, want the bound %d", n, maxSchedulerTools)
	}
	if got := s.Cap(epoch, "tool-0"); got != 4 {
		t.Fatalf("the oldest tool was forgotten: cap %d, want 4", got)
	}
	last := fmt.Sprintf("tool-%d", maxSchedulerTools+9)
	if got := s.Cap(epoch.Add(time.Second), last); got != 2 {
		t.Fatalf("the newest tool: cap %d, want 2", got)
	}
}

func TestSchedulerOddCap(t *testing.T) {
	s := NewScheduler(SchedulerConfig{ParallelCap: 3, TimeoutRate: 0.5, MinCalls: 1, Window: time.Minute})
	s.Record("t", true, epoch)
	if got := s.Cap(epoch, "t"); got != 1 {
		t.Fatalf("half of 3: cap %d, want 1", got)
	}
}
