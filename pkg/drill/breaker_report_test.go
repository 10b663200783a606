package drill

import (
	"testing"
	"time"

	"google.golang.org/protobuf/types/known/timestamppb"

	eventsv1 "github.com/mantle-mesh/mantle/pkg/api/mantle/events/v1"
	mantlev1 "github.com/mantle-mesh/mantle/pkg/api/mantle/v1"
)

// TestMeshConfigScalesScoutInterval: an explicit scout interval is scenario time like the
// open period; 0 (follow open_duration) and a negative one (off) keep their meaning.
func TestMeshConfigScalesScoutInterval(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name      string
		set, want time.Duration
	}{
		{"explicit", 20 * time.Second, 2 * time.Second},
		{"follows open_duration", 0, 0},
		{"off", -time.Nanosecond, -time.Nanosecond},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s, err := Builtin("recovery-herd")
			if err != nil {
				t.Fatal(err)
			}
			s.Router.Breaker.ScoutInterval = tt.set
			if got := s.MeshConfig("http://sim/v1", 0.1).Router.Breaker.ScoutInterval; got != tt.want {
				t.Errorf("scout interval %s at scale 0.1, want %s", got, tt.want)
			}
		})
	}
}

// TestBreakerHistoryCountsTheScout: a half-open period that a successful scout opened
// counts that scout among its calls: it was sent while the breaker was open, but it is the
// trial's first probe.
func TestBreakerHistoryCountsTheScout(t *testing.T) {
	t.Parallel()
	const (
		open     = mantlev1.BreakerState_BREAKER_STATE_OPEN
		halfOpen = mantlev1.BreakerState_BREAKER_STATE_HALF_OPEN
		closed   = mantlev1.BreakerState_BREAKER_STATE_CLOSED
	)
	s, err := Builtin("recovery-herd")
	if err != nil {
		t.Fatal(err)
	}
	start := time.Unix(1000, 0)
	ev := func(at time.Duration, from, to mantlev1.BreakerState, reason string) *eventsv1.BreakerTransitionEvent {
		return &eventsv1.BreakerTransitionEvent{At: timestamppb.New(start.Add(at)), Model: "primary", From: from, To: to, Reason: reason}
	}
	tests := []struct {
		name   string
		reason string // of the move to half-open
		want   int
	}{
		{"open period elapsed", "open period elapsed", 2},
		{"scout succeeded", "scout succeeded", 3},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			d := sideData{
				start: start, wall: time.Minute,
				breakers: []*eventsv1.BreakerTransitionEvent{
					ev(0, closed, open, "5 consecutive failures"),
					ev(10*time.Second, open, halfOpen, tt.reason),
					ev(11*time.Second, halfOpen, closed, "probes succeeded"),
				},
				calls: []upstreamCall{
					{At: 9 * time.Second, Model: "primary"}, // while open: the scout, if there was one
					{At: 10 * time.Second, Model: "primary"},
					{At: 10500 * time.Millisecond, Model: "primary"},
					{At: 12 * time.Second, Model: "primary"}, // closed again
				},
			}
			p := &plan{s: s, scale: 1, sc: scaler(1)}
			mbs := p.breakerHistory(d, func(d time.Duration) float64 { return d.Seconds() })
			if len(mbs) != 1 || mbs[0].MaxProbeCalls != tt.want {
				t.Fatalf("breakers %+v, want one with %d calls in its half-open period", mbs, tt.want)
			}
		})
	}
}
