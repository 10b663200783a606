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
			name: "falls by StepDown under half the limit, to exactly 0",
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
			s := New(testConfig, scripted(t, delays...), clockwork.NewFakeClock(), nil,
				func(c Change) { changes = append(changes, c) })
			if s.Share() != 0 || s.Delay() != 0 {
				t.Fatalf("new shedder: share %g, delay %v; want 0, 0", s.Share(), s.Delay())
			}
			var want []Change
			for i, st := range tt.steps {
				s.adjust()
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
	s := New(testConfig, scripted(t, time.Second, 0, 0), clockwork.NewFakeClock(), nil, nil)
	for _, want := range []float64{0.1, 0.05, 0} {
		s.adjust() // a nil onChange must not be called
		if got := s.Share(); !near(got, want) {
			t.Fatalf("share = %v, want %v", got, want)
		}
	}
}
