package overload

import (
	"context"
	"math"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jonboulle/clockwork"

	mantlev1 "github.com/mantle-mesh/mantle/pkg/api/mantle/v1"
)

const (
	critical    = mantlev1.Priority_PRIORITY_CRITICAL
	high        = mantlev1.Priority_PRIORITY_HIGH
	normal      = mantlev1.Priority_PRIORITY_NORMAL
	batch       = mantlev1.Priority_PRIORITY_BATCH
	unspecified = mantlev1.Priority_PRIORITY_UNSPECIFIED
)

// testConfig is the shedder the tests drive: 100 ms limit, so the hold band is
// [50 ms, 100 ms].
var testConfig = Config{MaxSchedulingDelay: 100 * time.Millisecond, MaxShare: 0.9}

// near compares shares that went through float steps (0.1 three times is not 0.3).
func near(a, b float64) bool { return math.Abs(a-b) < 1e-9 }

// scripted returns a delay func answering ds in order; it fails the test if called more
// often than that.
func scripted(t *testing.T, ds ...time.Duration) func() time.Duration {
	t.Helper()
	i := 0
	return func() time.Duration {
		if i >= len(ds) {
			t.Fatalf("delay read %d times, script has %d", i+1, len(ds))
		}
		d := ds[i]
		i++
		return d
	}
}

// recv waits for one value of ch; the timeout only turns a hang into a failure.
func recv[T any](t *testing.T, ch <-chan T, what string) T {
	t.Helper()
	select {
	case v := <-ch:
		return v
	case <-time.After(10 * time.Second):
		t.Fatalf("no %s within 10s", what)
		panic("unreachable")
	}
}

// adjustStep is one interval: the delay read, the share after it (compared with near;
// exact when 0 or when exact is set), and the onChange call it makes, if any.
type adjustStep struct {
	delay  time.Duration
	share  float64
	exact  bool
	change *Change
}

func on(d time.Duration) *Change  { return &Change{Shedding: true, Delay: d} }
func off(d time.Duration) *Change { return &Change{Shedding: false, Delay: d} }

// upTo is n intervals over the limit from share 0: the first starts shedding.
func upTo(n int, d time.Duration) []adjustStep {
	var steps []adjustStep
	for i := 1; i <= n; i++ {
		st := adjustStep{delay: d, share: min(testConfig.MaxShare, float64(i)*StepUp)}
		if i == 1 {
			st.change = on(d)
		}
		steps = append(steps, st)
	}
	return steps
}

// downFrom is n intervals under half the limit from share from, each StepDown lower;
// the last one reaches exactly 0 and stops shedding.
func downFrom(from float64, n int, d time.Duration) []adjustStep {
	var steps []adjustStep
	for i := 1; i <= n; i++ {
		st := adjustStep{delay: d, share: max(0, from-float64(i)*StepDown)}
		if i == n {
			st.share, st.change = 0, off(d)
		}
		steps = append(steps, st)
	}
	return steps
}

func TestAdjust(t *testing.T) {
	const ms = time.Millisecond
	tests := []struct {
		name  string
		steps []adjustStep
	}{
		{
			name: "at or under the limit nothing moves",
			steps: []adjustStep{
				{delay: 0}, {delay: 49 * ms}, {delay: 50 * ms}, {delay: 100 * ms},
			},
		},
		{
			name: "rises by StepUp per interval over the limit, capped at MaxShare",
			steps: []adjustStep{
				{delay: 101 * ms, share: 0.1, change: on(101 * ms)},
				{delay: time.Second, share: 0.2}, {delay: 150 * ms, share: 0.3},
				{delay: 150 * ms, share: 0.4}, {delay: 150 * ms, share: 0.5},
				{delay: 150 * ms, share: 0.6}, {delay: 150 * ms, share: 0.7},
				{delay: 150 * ms, share: 0.8}, {delay: 150 * ms, share: 0.9},
				{delay: 150 * ms, share: 0.9, exact: true},
				{delay: 10 * time.Second, share: 0.9, exact: true},
			},
		},
		{
			name: "holds from half the limit to the limit, both included",
			steps: []adjustStep{
				{delay: 200 * ms, share: 0.1, change: on(200 * ms)},
				{delay: 200 * ms, share: 0.2},
				{delay: 100 * ms, share: 0.2}, {delay: 75 * ms, share: 0.2}, {delay: 50 * ms, share: 0.2},
				{delay: 101 * ms, share: 0.3},
				{delay: 50 * ms, share: 0.3}, {delay: 100 * ms, share: 0.3},
			},
		},
		{
			// 0.1 three times is 0.30000000000000004: six StepDowns leave ~7e-17, which
			// must end as 0, or shedding would never be reported stopped.
			name:  "falls by StepDown under half the limit, to exactly 0",
			steps: append(upTo(3, 150*ms), downFrom(0.3, 6, 49*ms)...),
		},
		{
			name:  "from MaxShare down to exactly 0 in 18 intervals",
			steps: append(upTo(10, 150*ms), downFrom(0.9, 18, 25*ms)...),
		},
		{
			name: "shedding stops and starts again, one call each time",
			steps: []adjustStep{
				{delay: 300 * ms, share: 0.1, change: on(300 * ms)},
				{delay: 60 * ms, share: 0.1},
				{delay: 10 * ms, share: 0.05},
				{delay: 60 * ms, share: 0.05},
				{delay: 120 * ms, share: 0.15},
				{delay: 1 * ms, share: 0.1}, {delay: 1 * ms, share: 0.05},
				{delay: 2 * ms, share: 0, change: off(2 * ms)},
				{delay: 0}, {delay: 100 * ms},
				{delay: 400 * ms, share: 0.1, change: on(400 * ms)},
			},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			delays := make([]time.Duration, len(tt.steps))
			for i, st := range tt.steps {
				delays[i] = st.delay
			}
			var changes []Change
			s := New(testConfig, Signals{Delay: scripted(t, delays...)}, clockwork.NewFakeClock(), nil,
				func(_ context.Context, c Change) { changes = append(changes, c) })
			if s.Share() != 0 || s.Delay() != 0 {
				t.Fatalf("new shedder: share %g, delay %v; want 0, 0", s.Share(), s.Delay())
			}
			var want []Change
			for i, st := range tt.steps {
				s.adjust(context.Background())
				if st.change != nil {
					want = append(want, *st.change)
				}
				got := s.Share()
				switch {
				case (st.share == 0 || st.exact) && got != st.share:
					t.Errorf("step %d (delay %v): share = %v, want exactly %v", i, st.delay, got, st.share)
				case !near(got, st.share):
					t.Errorf("step %d (delay %v): share = %v, want %v", i, st.delay, got, st.share)
				}
				if got < 0 || got > testConfig.MaxShare {
					t.Errorf("step %d: share = %v, outside [0, MaxShare=%v]", i, got, testConfig.MaxShare)
				}
				if d := s.Delay(); d != st.delay {
					t.Errorf("step %d: Delay() = %v, want the last read %v", i, d, st.delay)
				}
				if !slices.Equal(changes, want) {
					t.Fatalf("step %d (delay %v): onChange calls %+v, want %+v", i, st.delay, changes, want)
				}
			}
		})
	}
}

func TestAdjustWithoutOnChange(t *testing.T) {
	s := New(testConfig, Signals{Delay: scripted(t, time.Second, 0, 0)}, clockwork.NewFakeClock(), nil, nil)
	for _, want := range []float64{0.1, 0.05, 0} {
		s.adjust(context.Background()) // a nil onChange must not be called
		if got := s.Share(); !near(got, want) {
			t.Fatalf("share = %v, want %v", got, want)
		}
	}
}

// shedderAt returns a shedder of cfg whose share went up ups intervals (0.1 each, capped
// at cfg.MaxShare), drawing from random.
func shedderAt(t *testing.T, cfg Config, ups int, random func() float64) *Shedder {
	t.Helper()
	over := make([]time.Duration, ups)
	for i := range over {
		over[i] = cfg.MaxSchedulingDelay + time.Millisecond
	}
	s := New(cfg, Signals{Delay: scripted(t, over...)}, clockwork.NewFakeClock(), random, nil)
	s.inFlight.Add(int64(cfg.MinInFlight)) // enough requests in flight to shed
	for range ups {
		s.adjust(context.Background())
	}
	s.inFlight.Add(-int64(cfg.MinInFlight))
	if want := min(cfg.MaxShare, float64(ups)*StepUp); !near(s.Share(), want) {
		t.Fatalf("share after %d intervals over the limit = %v, want %v", ups, s.Share(), want)
	}
	return s
}

// below is the largest float64 under x: a draw that must be shed when x is the share.
func below(x float64) float64 { return math.Nextafter(x, 0) }

func TestAdmit(t *testing.T) {
	// random is given the shedder's share (of normal requests) and answers the draw.
	fixed := func(r float64) func(float64) float64 { return func(float64) float64 { return r } }
	tests := []struct {
		name     string
		ups      int // intervals over the limit: share 0.1 each, at most 0.9
		priority mantlev1.Priority
		random   func(share float64) float64
		want     bool
	}{
		// Share 0: everything is served, whatever the draw.
		{name: "share 0, critical", ups: 0, priority: critical, random: fixed(0), want: true},
		{name: "share 0, high", ups: 0, priority: high, random: fixed(0), want: true},
		{name: "share 0, normal", ups: 0, priority: normal, random: fixed(0), want: true},
		{name: "share 0, unspecified", ups: 0, priority: unspecified, random: fixed(0), want: true},
		{name: "share 0, batch", ups: 0, priority: batch, random: fixed(0), want: true},

		// Critical: never shed, even at the lowest draw and the highest share.
		{name: "critical, share 0.4, draw 0", ups: 4, priority: critical, random: fixed(0), want: true},
		{name: "critical, share 0.9, draw 0", ups: 10, priority: critical, random: fixed(0), want: true},

		// High: shed iff draw < share/2.
		{name: "high, draw 0", ups: 4, priority: high, random: fixed(0), want: false},
		{name: "high, draw just under share/2", ups: 4, priority: high, random: func(s float64) float64 { return below(s / 2) }, want: false},
		{name: "high, draw at share/2", ups: 4, priority: high, random: func(s float64) float64 { return s / 2 }, want: true},
		{name: "high, draw under share but over share/2", ups: 4, priority: high, random: below, want: true},

		// Normal: shed iff draw < share.
		{name: "normal, draw 0", ups: 4, priority: normal, random: fixed(0), want: false},
		{name: "normal, draw just under share", ups: 4, priority: normal, random: below, want: false},
		{name: "normal, draw at share", ups: 4, priority: normal, random: func(s float64) float64 { return s }, want: true},
		{name: "normal, highest draw at MaxShare", ups: 10, priority: normal, random: fixed(below(1)), want: true},

		// Unspecified is normal.
		{name: "unspecified, draw just under share", ups: 4, priority: unspecified, random: below, want: false},
		{name: "unspecified, draw at share", ups: 4, priority: unspecified, random: func(s float64) float64 { return s }, want: true},

		// Batch: shed iff draw < min(1, 2*share).
		{name: "batch, draw just under 2*share", ups: 4, priority: batch, random: func(s float64) float64 { return below(2 * s) }, want: false},
		{name: "batch, draw at 2*share", ups: 4, priority: batch, random: func(s float64) float64 { return 2 * s }, want: true},
		{name: "batch, share 0.6 sheds every draw", ups: 6, priority: batch, random: fixed(below(1)), want: false},
		{name: "batch, share 0.5 sheds every draw", ups: 5, priority: batch, random: fixed(below(1)), want: false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var s *Shedder
			draws := 0
			s = shedderAt(t, testConfig, tt.ups, func() float64 { draws++; return tt.random(s.Share()) })
			got := s.Admit(tt.priority)
			if got != tt.want {
				t.Fatalf("Admit(%v) at share %v, draw %v = %v, want %v", tt.priority, s.Share(), tt.random(s.Share()), got, tt.want)
			}
			if tt.ups > 0 && draws != 1 {
				t.Errorf("random drawn %d times, want once", draws)
			}
			wantInFlight := int64(0)
			if got {
				wantInFlight = 1
			}
			if n := s.InFlight(); n != wantInFlight {
				t.Errorf("InFlight after Admit = %v = %d, want %d", got, n, wantInFlight)
			}
			if got {
				s.Done()
				if n := s.InFlight(); n != 0 {
					t.Errorf("InFlight after Done = %d, want 0", n)
				}
			}
		})
	}
}

// TestAdjustNeedsRequestsInFlight: with fewer requests in flight than MinInFlight, nothing
// could be shed, so a long wait raises no share and announces no overload; a share that
// was raised falls as if the wait were short.
func TestAdjustNeedsRequestsInFlight(t *testing.T) {
	const ms = time.Millisecond
	cfg := testConfig
	cfg.MinInFlight = 5
	var changes []Change
	s := New(cfg, Signals{Delay: scripted(t, 500*ms, 500*ms, 500*ms, 500*ms, 500*ms)}, clockwork.NewFakeClock(), nil,
		func(_ context.Context, c Change) { changes = append(changes, c) })
	ctx := context.Background()
	s.adjust(ctx) // nothing in flight
	if s.Share() != 0 || len(changes) != 0 {
		t.Fatalf("idle: share %v, changes %+v; want 0 and none", s.Share(), changes)
	}
	s.inFlight.Add(5)
	s.adjust(ctx)
	s.adjust(ctx)
	if !near(s.Share(), 0.2) || len(changes) != 1 {
		t.Fatalf("5 in flight: share %v, changes %+v; want 0.2 and shedding announced", s.Share(), changes)
	}
	s.inFlight.Add(-1)
	s.adjust(ctx)
	if !near(s.Share(), 0.15) {
		t.Errorf("4 in flight: share %v, want 0.15 (falling although the wait is long)", s.Share())
	}
	s.adjust(ctx)
	if !near(s.Share(), 0.1) || len(changes) != 1 {
		t.Errorf("share %v, changes %+v; want 0.1 and no second announcement", s.Share(), changes)
	}
}

func TestAdmitMinInFlight(t *testing.T) {
	cfg := testConfig
	cfg.MinInFlight = 3
	// Share 0.9, draw 0: every normal request is shed unless MinInFlight protects it.
	s := shedderAt(t, cfg, 10, func() float64 { return 0 })
	type op struct {
		admit        bool // false: Done
		priority     mantlev1.Priority
		want         bool // Admit's answer
		wantInFlight int64
	}
	ops := []op{
		{admit: true, priority: normal, want: true, wantInFlight: 1},
		{admit: true, priority: batch, want: true, wantInFlight: 2},
		{admit: true, priority: normal, want: true, wantInFlight: 3},  // InFlight = MinInFlight, counting itself
		{admit: true, priority: normal, want: false, wantInFlight: 3}, // 4 > 3: shed, and not left counted
		{admit: true, priority: batch, want: false, wantInFlight: 3},
		{admit: true, priority: high, want: false, wantInFlight: 3},
		{admit: true, priority: critical, want: true, wantInFlight: 4}, // critical past MinInFlight
		{admit: true, priority: normal, want: false, wantInFlight: 4},
		{wantInFlight: 3},
		{wantInFlight: 2},
		{admit: true, priority: normal, want: true, wantInFlight: 3}, // room again under MinInFlight
		{admit: true, priority: normal, want: false, wantInFlight: 3},
		{wantInFlight: 2}, {wantInFlight: 1}, {wantInFlight: 0},
	}
	for i, o := range ops {
		if !o.admit {
			s.Done()
		} else if got := s.Admit(o.priority); got != o.want {
			t.Fatalf("op %d: Admit(%v) with %d in flight = %v, want %v", i, o.priority, s.InFlight(), got, o.want)
		}
		if n := s.InFlight(); n != o.wantInFlight {
			t.Fatalf("op %d: InFlight = %d, want %d", i, n, o.wantInFlight)
		}
	}
}

// Admit and Done from many goroutines while the share is adjusted (held: the delay is in
// the hold band) and read: the count balances, and the draws, handed out in a fixed
// cycle, shed exactly the share of them they should.
func TestAdmitConcurrent(t *testing.T) {
	const goroutines, perGoroutine = 8, 500
	var draw atomic.Int64
	// 0.05, 0.15, ..., 0.95: half of them under a share of 0.5.
	random := func() float64 { return 0.05 + float64(draw.Add(1)%10)/10 }
	s := shedderAt(t, testConfig, 5, random)
	s.delay = func() time.Duration { return 75 * time.Millisecond } // hold
	stop := make(chan struct{})
	var bg sync.WaitGroup
	bg.Go(func() {
		for {
			select {
			case <-stop:
				return
			default:
				s.adjust(context.Background())
				_, _, _ = s.Share(), s.Delay(), s.InFlight()
			}
		}
	})
	var admitted, shed atomic.Int64
	var wg sync.WaitGroup
	for range goroutines {
		wg.Go(func() {
			for range perGoroutine {
				if s.Admit(normal) {
					admitted.Add(1)
					if s.InFlight() < 1 {
						t.Error("an admitted request is not counted in flight")
					}
					s.Done()
				} else {
					shed.Add(1)
				}
			}
		})
	}
	wg.Wait()
	close(stop)
	bg.Wait()
	if n := s.InFlight(); n != 0 {
		t.Errorf("InFlight after every admitted request is done = %d, want 0", n)
	}
	const total = goroutines * perGoroutine
	if admitted.Load()+shed.Load() != total || shed.Load() != total/2 {
		t.Errorf("admitted %d, shed %d of %d at share 0.5; want %d shed", admitted.Load(), shed.Load(), total, total/2)
	}
	if !near(s.Share(), 0.5) {
		t.Errorf("share after holding = %v, want 0.5", s.Share())
	}
}

func TestShareOf(t *testing.T) {
	tests := []struct {
		share    float64
		priority mantlev1.Priority
		want     float64
	}{
		{0, critical, 0}, {0, high, 0}, {0, normal, 0}, {0, unspecified, 0}, {0, batch, 0},
		{0.4, critical, 0}, {0.4, high, 0.2}, {0.4, normal, 0.4}, {0.4, unspecified, 0.4}, {0.4, batch, 0.8},
		{0.5, critical, 0}, {0.5, high, 0.25}, {0.5, normal, 0.5}, {0.5, unspecified, 0.5}, {0.5, batch, 1},
		{0.9, critical, 0}, {0.9, high, 0.45}, {0.9, normal, 0.9}, {0.9, unspecified, 0.9}, {0.9, batch, 1},
		{0.4, mantlev1.Priority(99), 0.4}, // a priority this build does not know: normal
	}
	for _, tt := range tests {
		if got := ShareOf(tt.share, tt.priority); got != tt.want {
			t.Errorf("ShareOf(%v, %v) = %v, want %v", tt.share, tt.priority, got, tt.want)
		}
	}
}

func TestRun(t *testing.T) {
	const ms = time.Millisecond
	script := []time.Duration{150 * ms, 150 * ms, 75 * ms, 10 * ms, 10 * ms, 10 * ms, 10 * ms}
	wantShare := []float64{0.1, 0.2, 0.2, 0.15, 0.1, 0.05, 0}
	wantChanges := []Change{{Shedding: true, Delay: 150 * ms}, {Shedding: false, Delay: 10 * ms}}

	clock := clockwork.NewFakeClock()
	// Each delay read announces its index, then waits for the test's release: while it
	// waits, the previous interval's adjust is over and this one's has not begun.
	called := make(chan int)
	release := make(chan struct{})
	calls := 0 // Run's goroutine only; read once Run has returned
	delay := func() time.Duration {
		i := calls
		calls++
		called <- i // a read past the script blocks here, and Run never returns
		<-release
		return script[i]
	}
	var changes []Change // Run's goroutine only, like calls
	s := New(testConfig, Signals{Delay: delay}, clock, nil, func(_ context.Context, c Change) { changes = append(changes, c) })

	ctx, cancel, done := runOn(t, s, clock)
	defer cancel()
	for i := range script {
		clock.Advance(Interval)
		if got := recv(t, called, "delay read after Advance"); got != i {
			t.Fatalf("Advance %d led to delay read %d", i, got)
		}
		prevShare, prevDelay := 0.0, time.Duration(0)
		if i > 0 {
			prevShare, prevDelay = wantShare[i-1], script[i-1]
		}
		if got := s.Share(); !near(got, prevShare) {
			t.Errorf("share before interval %d's adjust = %v, want %v", i, got, prevShare)
		}
		if got := s.Delay(); got != prevDelay {
			t.Errorf("Delay() before interval %d's adjust = %v, want %v", i, got, prevDelay)
		}
		release <- struct{}{}
	}

	cancel()
	if err := recv(t, done, "return from Run after cancel"); err != nil {
		t.Fatalf("Run = %v, want nil when its context ends", err)
	}
	if calls != len(script) {
		t.Errorf("delay read %d times for %d intervals, want once each", calls, len(script))
	}
	if got := s.Share(); got != 0 {
		t.Errorf("final share = %v, want exactly 0", got)
	}
	if got := s.Delay(); got != script[len(script)-1] {
		t.Errorf("final Delay() = %v, want %v", got, script[len(script)-1])
	}
	if !slices.Equal(changes, wantChanges) {
		t.Errorf("onChange calls %+v, want %+v", changes, wantChanges)
	}
	if err := clock.BlockUntilContext(ctx, 1); err == nil { // ctx is done: no waiting
		t.Error("Run left its ticker running after it returned")
	}
}

func TestRunCancelledBeforeAnyInterval(t *testing.T) {
	clock := clockwork.NewFakeClock()
	s := New(testConfig, Signals{Delay: func() time.Duration {
		t.Error("delay read with no interval passed")
		return 0
	}}, clock, nil, nil)
	_, cancel, done := runOn(t, s, clock)
	cancel()
	if err := recv(t, done, "return from Run after cancel"); err != nil {
		t.Fatalf("Run = %v, want nil", err)
	}
}

func TestRunSheddingOff(t *testing.T) {
	clock := clockwork.NewFakeClock()
	cfg := testConfig
	cfg.MaxSchedulingDelay = 0
	s := New(cfg, Signals{Delay: func() time.Duration {
		t.Error("delay read with shedding off")
		return time.Hour
	}}, clock, nil, nil)
	done := make(chan error, 1)
	go func() { done <- s.Run(t.Context()) }() // a context that does not end during the test
	if err := recv(t, done, "return from Run with shedding off"); err != nil {
		t.Fatalf("Run = %v, want nil", err)
	}
	ended, cancel := context.WithCancel(t.Context())
	cancel()
	if err := clock.BlockUntilContext(ended, 1); err == nil {
		t.Error("Run with shedding off left a ticker on the clock")
	}
	if s.Share() != 0 {
		t.Errorf("share with shedding off = %v, want 0", s.Share())
	}
}

func TestConfigValidate(t *testing.T) {
	tests := []struct {
		name    string
		cfg     Config
		wantErr []string // keys the message must name; nil: valid
		notKeys []string // keys it must not name
	}{
		{name: "router default", cfg: Config{MaxSchedulingDelay: 100 * time.Millisecond, MinInFlight: 64, MaxShare: 0.9}},
		{name: "shedding off", cfg: Config{MaxSchedulingDelay: 0, MinInFlight: 0, MaxShare: 0.5}},
		{name: "tiny share, smallest delay", cfg: Config{MaxSchedulingDelay: time.Millisecond, MaxShare: 1e-9}},
		{name: "off: the rest is not checked", cfg: Config{}},
		{name: "delay under a millisecond", cfg: Config{MaxSchedulingDelay: time.Microsecond, MaxShare: 0.9},
			wantErr: []string{"max_scheduling_delay"}, notKeys: []string{"min_in_flight", "max_share"}},
		{name: "share just under 1", cfg: Config{MaxSchedulingDelay: time.Second, MaxShare: below(1)}},
		{name: "negative delay", cfg: Config{MaxSchedulingDelay: -time.Millisecond, MaxShare: 0.9},
			wantErr: []string{"max_scheduling_delay"}, notKeys: []string{"min_in_flight", "max_share"}},
		{name: "negative min in flight", cfg: Config{MaxSchedulingDelay: time.Millisecond, MinInFlight: -1, MaxShare: 0.9},
			wantErr: []string{"min_in_flight"}, notKeys: []string{"max_scheduling_delay", "max_share"}},
		{name: "share 0", cfg: Config{MaxSchedulingDelay: time.Millisecond, MaxShare: 0},
			wantErr: []string{"max_share"}, notKeys: []string{"max_scheduling_delay", "min_in_flight"}},
		{name: "share 1", cfg: Config{MaxSchedulingDelay: time.Millisecond, MaxShare: 1},
			wantErr: []string{"max_share"}, notKeys: []string{"max_scheduling_delay", "min_in_flight"}},
		{name: "share over 1", cfg: Config{MaxSchedulingDelay: time.Millisecond, MaxShare: 1.5},
			wantErr: []string{"max_share"}},
		{name: "negative share", cfg: Config{MaxSchedulingDelay: time.Millisecond, MaxShare: -0.1},
			wantErr: []string{"max_share"}},
		{name: "NaN share", cfg: Config{MaxSchedulingDelay: time.Millisecond, MaxShare: math.NaN()},
			wantErr: []string{"max_share"}},
		{name: "infinite share", cfg: Config{MaxSchedulingDelay: time.Millisecond, MaxShare: math.Inf(1)},
			wantErr: []string{"max_share"}},
		{name: "everything wrong, every key named", cfg: Config{MaxSchedulingDelay: -1, MinInFlight: -5, MaxShare: 2},
			wantErr: []string{"max_scheduling_delay", "min_in_flight", "max_share"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := tt.cfg.Validate()
			if tt.wantErr == nil {
				if err != nil {
					t.Fatalf("Validate(%+v) = %v, want nil", tt.cfg, err)
				}
				return
			}
			if err == nil {
				t.Fatalf("Validate(%+v) = nil, want an error naming %v", tt.cfg, tt.wantErr)
			}
			lines := strings.Split(err.Error(), "\n")
			if len(lines) != len(tt.wantErr) {
				t.Errorf("Validate(%+v) = %q: %d lines, want one per bad key %v", tt.cfg, err, len(lines), tt.wantErr)
			}
			for _, key := range tt.wantErr {
				if !slices.ContainsFunc(lines, func(l string) bool { return strings.HasPrefix(l, key+": ") }) {
					t.Errorf("Validate(%+v) = %q, want a line starting %q", tt.cfg, err, key+": ")
				}
			}
			for _, key := range tt.notKeys {
				if strings.Contains(err.Error(), key) {
					t.Errorf("Validate(%+v) = %q names %q, though that key is fine", tt.cfg, err, key)
				}
			}
		})
	}
}

// runOn starts s.Run and returns once its ticker waits on clock; cancel ends Run, and
// done then receives what it returned.
func runOn(t *testing.T, s *Shedder, clock *clockwork.FakeClock) (ctx context.Context, cancel context.CancelFunc, done <-chan error) {
	t.Helper()
	ctx, cancel = context.WithCancel(t.Context())
	result := make(chan error, 1)
	go func() { result <- s.Run(ctx) }()
	waitCtx, waitCancel := context.WithTimeout(ctx, 10*time.Second)
	defer waitCancel()
	if err := clock.BlockUntilContext(waitCtx, 1); err != nil {
		cancel()
		t.Fatalf("Run's ticker never started: %v", err)
	}
	return ctx, cancel, result
}

// interval is one interval of a shedder that reads the process's CPU: the scheduling delay
// read, the requests that arrived and the CPU the process used; then the share and Cost
// after adjust, and the onChange call, if any.
type interval struct {
	delay   time.Duration
	arrived int
	cpu     time.Duration
	share   float64
	cost    time.Duration
	change  *Change
}

// runIntervals drives a shedder of cfg (MinInFlight 0) through steps, checking each.
func runIntervals(t *testing.T, cfg Config, steps []interval) {
	t.Helper()
	var now time.Duration // the process's CPU so far
	i := -1
	delay := func() time.Duration { return steps[i].delay }
	var changes, want []Change
	s := New(cfg, Signals{Delay: delay, CPU: func() (time.Duration, bool) { return now, true }}, clockwork.NewFakeClock(), func() float64 { return 0.5 },
		func(_ context.Context, c Change) { changes = append(changes, c) })
	for i = range steps {
		st := steps[i]
		for range st.arrived {
			if s.Admit(normal) {
				s.Done()
			}
		}
		now += st.cpu
		s.adjust(context.Background())
		if st.change != nil {
			want = append(want, *st.change)
		}
		if got := s.Share(); !near(got, st.share) {
			t.Errorf("interval %d: share = %v, want %v", i, got, st.share)
		}
		if got := s.Cost(); got != st.cost {
			t.Errorf("interval %d: Cost() = %v, want %v", i, got, st.cost)
		}
		if !slices.Equal(changes, want) {
			t.Fatalf("interval %d: onChange calls %+v, want %+v", i, changes, want)
		}
	}
}

// TestAdjustJumpsToTheExcess: the cost of a request is learnt from the busiest calm
// interval, and an overload sheds at once what arrived beyond nine tenths of what the CPU
// the process got serves at that cost.
func TestAdjustJumpsToTheExcess(t *testing.T) {
	const ms = time.Millisecond
	cfg := Config{MaxSchedulingDelay: 100 * ms, MaxShare: 0.9}
	over := func(d time.Duration) *Change { return &Change{Shedding: true, Delay: d} }
	tests := []struct {
		name  string
		steps []interval
	}{
		{
			name: "no cost learnt: StepUp alone",
			steps: []interval{
				{delay: 200 * ms, arrived: 1000, cpu: 100 * ms, share: 0.1, change: over(200 * ms)},
			},
		},
		{
			// Capacity 0.9 * 450 ms / 0.5 ms = 810 of 1000 arrived: 0.19 shed.
			name: "sheds the excess at once",
			steps: []interval{
				{delay: ms, arrived: 400, cpu: 200 * ms, cost: 500 * time.Microsecond},
				{delay: 200 * ms, arrived: 1000, cpu: 450 * ms, cost: 500 * time.Microsecond, share: 0.19, change: over(200 * ms)},
				{delay: 200 * ms, arrived: 1000, cpu: 50 * ms, cost: 500 * time.Microsecond, share: 0.9},  // capped
				{delay: 60 * ms, arrived: 100, cpu: 50 * ms, cost: 500 * time.Microsecond, share: 0.9},    // holds: nothing learnt
				{delay: 200 * ms, arrived: 1000, cpu: 500 * ms, cost: 500 * time.Microsecond, share: 0.9}, // never below share+StepUp's floor
			},
		},
		{
			name: "an excess under StepUp takes StepUp",
			steps: []interval{
				{delay: ms, arrived: 100, cpu: 100 * ms, cost: ms},
				{delay: 200 * ms, arrived: 100, cpu: 100 * ms, cost: ms, share: 0.1, change: over(200 * ms)},
				{delay: 200 * ms, arrived: 100, cpu: 20 * ms, cost: ms, share: 0.82}, // 1 - 0.9*20/100
			},
		},
		{
			// A request costs less CPU at a higher rate: the busiest interval is the closest
			// to an overload, wherever it is among the last calmIntervals.
			name: "the busiest calm interval sets the cost",
			steps: []interval{
				{delay: ms, arrived: 100, cpu: 100 * ms, cost: ms},
				{delay: ms, arrived: 1000, cpu: 400 * ms, cost: 400 * time.Microsecond},
				{delay: ms, arrived: 50, cpu: 100 * ms, cost: 400 * time.Microsecond},
				{delay: ms, arrived: 15, cpu: 1 * ms, cost: 400 * time.Microsecond},          // too few to learn from
				{delay: 60 * ms, arrived: 2000, cpu: 100 * ms, cost: 400 * time.Microsecond}, // hold band: not calm
			},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) { runIntervals(t, cfg, tt.steps) })
	}
	t.Run("the busiest interval ages out after calmIntervals", func(t *testing.T) {
		steps := []interval{{delay: ms, arrived: 1000, cpu: 100 * ms, cost: 100 * time.Microsecond}}
		for i := 1; i < calmIntervals; i++ {
			steps = append(steps, interval{delay: ms, arrived: 100, cpu: 100 * ms, cost: 100 * time.Microsecond})
		}
		steps = append(steps, interval{delay: ms, arrived: 100, cpu: 100 * ms, cost: ms})
		runIntervals(t, cfg, steps)
	})
}

// TestRunCountsCPUFromItsStart: the CPU the process used before Run (starting up) is not
// the first interval's, which would make a request look as costly as the whole start.
func TestRunCountsCPUFromItsStart(t *testing.T) {
	clock := clockwork.NewFakeClock()
	var cpu atomic.Int64
	cpu.Store(int64(10 * time.Second)) // spent before Run
	read := make(chan struct{}, 1)     // the interval's read, after Run's own first one
	var reads atomic.Int64
	s := New(testConfig, Signals{
		Delay: func() time.Duration { return 0 },
		CPU: func() (time.Duration, bool) {
			if reads.Add(1) == 2 {
				read <- struct{}{}
			}
			return time.Duration(cpu.Load()), true
		},
	}, clock, nil, nil)
	_, cancel, done := runOn(t, s, clock)
	for range 100 {
		if s.Admit(normal) {
			s.Done()
		}
	}
	cpu.Add(int64(100 * time.Millisecond))
	clock.Advance(Interval)
	recv(t, read, "the interval's CPU read")
	cancel()
	if err := recv(t, done, "return from Run after cancel"); err != nil {
		t.Fatalf("Run = %v", err)
	}
	if got := s.Cost(); got != time.Millisecond {
		t.Errorf("Cost after 100 requests in 100 ms of CPU = %v, want 1ms", got)
	}
}
