package load

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

func TestConfigValidate(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name    string
		cfg     Config
		wantErr bool
		want    int
	}{
		{"one per millisecond for a second", Config{Rate: 1000, Duration: time.Second}, false, 1000},
		{"fractional rate rounds", Config{Rate: 2.5, Duration: 3 * time.Second}, false, 8},
		{"zero rate", Config{Rate: 0, Duration: time.Second}, true, 0},
		{"rate above the bound", Config{Rate: MaxRate + 1, Duration: time.Second}, true, 0},
		{"zero duration", Config{Rate: 10, Duration: 0}, true, 0},
		{"duration above the bound", Config{Rate: 10, Duration: MaxDuration + time.Second}, true, 0},
		{"negative in flight", Config{Rate: 10, Duration: time.Second, MaxInFlight: -1}, true, 0},
		{"no request at all", Config{Rate: 0.1, Duration: time.Second}, true, 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			err := tt.cfg.Validate()
			if (err != nil) != tt.wantErr {
				t.Fatalf("Validate() = %v, want error %t", err, tt.wantErr)
			}
			if !tt.wantErr && tt.cfg.Requests() != tt.want {
				t.Errorf("Requests() = %d, want %d", tt.cfg.Requests(), tt.want)
			}
		})
	}
}

func TestRunStartsEveryRequestOnSchedule(t *testing.T) {
	t.Parallel()
	cfg := Config{Rate: 2000, Duration: 50 * time.Millisecond}
	var mu sync.Mutex
	dues := map[int]time.Time{}
	st, err := Run(context.Background(), cfg, func(_ context.Context, i int, due time.Time) {
		mu.Lock()
		defer mu.Unlock()
		if _, dup := dues[i]; dup {
			t.Errorf("request %d started twice", i)
		}
		dues[i] = due
	}, nil)
	if err != nil {
		t.Fatalf("Run: %v", err)
	}
	if st.Started != cfg.Requests() || st.Shed != 0 || len(dues) != cfg.Requests() {
		t.Fatalf("started %d (%d recorded), shed %d; want %d started", st.Started, len(dues), st.Shed, cfg.Requests())
	}
	// Due times are the schedule itself, not when the requests happened to run: request i
	// is due exactly i intervals after request 0.
	interval := time.Second / 2000
	for i, due := range dues {
		if got := due.Sub(st.Start); got != time.Duration(i)*interval {
			t.Errorf("request %d due at +%s, want +%s", i, got, time.Duration(i)*interval)
		}
	}
}

func TestRunShedsBeyondMaxInFlight(t *testing.T) {
	t.Parallel()
	cfg := Config{Rate: 10_000, Duration: 2 * time.Millisecond, MaxInFlight: 3} // 20 requests
	release := make(chan struct{})
	var shed []int
	var ran atomic.Int32
	st, err := Run(context.Background(), cfg, func(context.Context, int, time.Time) {
		<-release // every started request holds its slot until all others were shed
		ran.Add(1)
	}, func(i int, _ time.Time) {
		shed = append(shed, i)
		if len(shed) == cfg.Requests()-cfg.MaxInFlight {
			close(release)
		}
	})
	if err != nil {
		t.Fatalf("Run: %v", err)
	}
	if st.Started != 3 || st.Shed != 17 || int(ran.Load()) != 3 {
		t.Errorf("started %d, shed %d, ran %d; want 3, 17, 3", st.Started, st.Shed, ran.Load())
	}
	for k, i := range shed {
		if i != k+3 {
			t.Fatalf("shed %v, want requests 3 to 19 in order", shed)
		}
	}
}

func TestRunStopsWhenContextEnds(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithCancel(context.Background())
	// One request per hour: after the first, the generator waits until ctx ends.
	cfg := Config{Rate: 1.0 / 3600, Duration: 3 * time.Hour}
	var sawDone atomic.Bool
	st, err := Run(ctx, cfg, func(ctx context.Context, i int, _ time.Time) {
		cancel()
		<-ctx.Done()
		sawDone.Store(true)
	}, nil)
	if !errors.Is(err, context.Canceled) {
		t.Fatalf("Run error = %v, want context.Canceled", err)
	}
	if st.Started != 1 || !sawDone.Load() {
		t.Errorf("started %d (want 1); running request saw ctx done: %t", st.Started, sawDone.Load())
	}
}

func TestRunRejectsInvalidConfig(t *testing.T) {
	t.Parallel()
	_, err := Run(context.Background(), Config{}, func(context.Context, int, time.Time) {
		t.Error("a request ran")
	}, nil)
	if err == nil {
		t.Fatal("Run with a zero Config succeeded")
	}
}

func TestSummarize(t *testing.T) {
	t.Parallel()
	ms := func(v int) time.Duration { return time.Duration(v) * time.Millisecond }
	var hundred []time.Duration
	for i := 100; i >= 1; i-- {
		hundred = append(hundred, ms(i))
	}
	tests := []struct {
		name string
		in   []time.Duration
		want Percentiles
	}{
		{"empty", nil, Percentiles{}},
		{"one", []time.Duration{ms(7)}, Percentiles{Count: 1, P50: ms(7), P90: ms(7), P95: ms(7), P99: ms(7), Max: ms(7), Mean: ms(7)}},
		{"1 to 100 ms, unsorted", hundred, Percentiles{Count: 100, P50: ms(50), P90: ms(90), P95: ms(95), P99: ms(99), Max: ms(100), Mean: 50500 * time.Microsecond}},
		{"a long tail", []time.Duration{ms(1), ms(1), ms(1), ms(1000)}, Percentiles{Count: 4, P50: ms(1), P90: ms(1000), P95: ms(1000), P99: ms(1000), Max: ms(1000), Mean: 250750 * time.Microsecond}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			if got := Summarize(tt.in); got != tt.want {
				t.Errorf("Summarize = %+v, want %+v", got, tt.want)
			}
		})
	}
}
