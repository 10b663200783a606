package quota

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"regexp"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/jonboulle/clockwork"
	"github.com/prometheus/client_golang/prometheus"

	mantlev1 "github.com/mantle-mesh/mantle/pkg/api/mantle/v1"
	"github.com/mantle-mesh/mantle/pkg/rpc"
)

func TestReserveRefillsOverFakeTime(t *testing.T) {
	t.Parallel()
	f := newFixture(t, testConfig())
	steps := []struct {
		name          string
		advance       time.Duration
		input, output int64
		wantTokens    int64 // remaining after the reservation
		wantRequests  int64
		wantReset     time.Duration // until TPM is full again
	}{
		{"drain the token bucket", 0, 5900, 100, 0, 59, time.Minute},
		{"half a window later half is back", 30 * time.Second, 1, 1, 2998, 59, 30*time.Second + 20*time.Millisecond},
		{"a window later all is back", time.Minute, 5900, 100, 0, 59, time.Minute},
		{"refill does not exceed capacity", 10 * time.Minute, 1, 1, 5998, 59, 20 * time.Millisecond},
	}
	for _, s := range steps {
		t.Run(s.name, func(t *testing.T) {
			f.clock.Advance(s.advance)
			got := f.reserve(t, "acme", s.input, s.output)
			if got.Levels.Tokens.Remaining != s.wantTokens || got.Levels.Requests.Remaining != s.wantRequests {
				t.Errorf("remaining tokens, requests = %d, %d; want %d, %d",
					got.Levels.Tokens.Remaining, got.Levels.Requests.Remaining, s.wantTokens, s.wantRequests)
			}
			if got.Levels.Tokens.Reset != s.wantReset {
				t.Errorf("token reset = %v, want %v", got.Levels.Tokens.Reset, s.wantReset)
			}
			if got.Levels.Tokens.Limit != 6000 || got.Levels.Requests.Limit != 60 {
				t.Errorf("limits = %d tokens, %d requests; want 6000, 60", got.Levels.Tokens.Limit, got.Levels.Requests.Limit)
			}
		})
	}
}

func TestReserveCountsMessagesWhenInputIsZero(t *testing.T) {
	t.Parallel()
	f := newFixture(t, testConfig())
	msgs := []Message{{Role: "user", Content: "the cat sat on the mat"}}
	got, err := f.svc.Reserve(context.Background(), ReserveRequest{Tenant: "acme", Model: "gpt-4o", Messages: msgs})
	if err != nil {
		t.Fatal(err)
	}
	// 3 reply priming + 4 framing + 6 words, plus the configured default max output.
	if got.InputTokens != 13 || got.MaxOutputTokens != 100 || got.ReservedTokens != 113 {
		t.Errorf("input, max output, reserved = %d, %d, %d; want 13, 100, 113", got.InputTokens, got.MaxOutputTokens, got.ReservedTokens)
	}
	if !regexp.MustCompile(`^[0-9a-f]{8}-[0-9a-f]{4}-4[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}$`).MatchString(got.ReservationID) {
		t.Errorf("reservation id %q is not a version 4 UUID", got.ReservationID)
	}
	if want := t0.Add(2 * time.Minute); !got.ExpiresAt.Equal(want) {
		t.Errorf("expires at %v, want %v", got.ExpiresAt, want)
	}
}

func TestReserveIsAllOrNothing(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name       string
		limits     RateLimits
		first      int64 // tokens of a granted reservation
		refused    int64 // tokens of the reservation that must be refused
		wantBucket string
	}{
		{"TPM refusal does not consume RPM", RateLimits{RPM: 2, TPM: 6000}, 5000, 2000, "tenant:acme:tpm"},
		{"RPM refusal does not consume TPM", RateLimits{RPM: 1, TPM: 6000}, 1000, 1000, "tenant:acme:rpm"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			cfg := testConfig()
			cfg.DefaultLimits = tt.limits
			f := newFixture(t, cfg)
			first := f.reserve(t, "acme", tt.first-1, 1)

			_, err := f.svc.Reserve(context.Background(), ReserveRequest{Tenant: "acme", Model: "m", InputTokens: tt.refused - 1, MaxOutputTokens: 1})
			if exhausted, ok := errors.AsType[*ExhaustedError](err); !ok || exhausted.Bucket != tt.wantBucket {
				t.Fatalf("err = %v, want *ExhaustedError on %s", err, tt.wantBucket)
			}

			// Settling the first reservation at its estimate shows both buckets exactly
			// as the first reservation left them.
			settled, err := f.svc.Settle(context.Background(), SettleRequest{Tenant: "acme", ReservationID: first.ReservationID, Usage: &Usage{TotalTokens: tt.first}})
			if err != nil {
				t.Fatal(err)
			}
			wantTokens, wantRequests := tt.limits.TPM-tt.first, tt.limits.RPM-1
			if got := settled.Levels; got.Tokens.Remaining != wantTokens || got.Requests.Remaining != wantRequests {
				t.Errorf("remaining tokens, requests = %d, %d; want %d, %d", got.Tokens.Remaining, got.Requests.Remaining, wantTokens, wantRequests)
			}
		})
	}
}

func TestReserveRetryAfterIsAccurate(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name          string
		limits        RateLimits
		drain         int64 // tokens reserved first
		need          int64 // tokens of the refused reservation
		wantRetry     time.Duration
		wantRemaining int64
	}{
		{"100 tokens per second", RateLimits{RPM: 600, TPM: 6000}, 6000, 250, 2500 * time.Millisecond, 0},
		{"partly refilled", RateLimits{RPM: 600, TPM: 6000}, 5900, 250, 1500 * time.Millisecond, 100},
		{"7 tokens per minute", RateLimits{RPM: 600, TPM: 7}, 7, 3, 25_714_285_715, 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			cfg := testConfig()
			cfg.DefaultLimits = tt.limits
			f := newFixture(t, cfg)
			f.reserve(t, "acme", tt.drain-1, 1)
			req := ReserveRequest{Tenant: "acme", Model: "m", InputTokens: tt.need - 1, MaxOutputTokens: 1}

			_, err := f.svc.Reserve(context.Background(), req)
			var exhausted *ExhaustedError
			if !errors.As(err, &exhausted) || !errors.Is(err, ErrExhausted) {
				t.Fatalf("err = %v, want *ExhaustedError", err)
			}
			want := ExhaustedError{Bucket: "tenant:acme:tpm", Cost: tt.need, Remaining: tt.wantRemaining, RetryAfter: tt.wantRetry}
			if diff := cmp.Diff(want, *exhausted); diff != "" {
				t.Fatalf("refusal mismatch (-want +got):\n%s", diff)
			}

			f.clock.Advance(tt.wantRetry - 1)
			if _, err := f.svc.Reserve(context.Background(), req); !errors.As(err, &exhausted) || exhausted.RetryAfter != 1 {
				t.Fatalf("1ns early: err = %v, want exhausted with retry after 1ns", err)
			}
			f.clock.Advance(1)
			if _, err := f.svc.Reserve(context.Background(), req); err != nil {
				t.Fatalf("at the retry time: %v, want granted", err)
			}
		})
	}
}

func TestReserveReportsTheLongerWait(t *testing.T) {
	t.Parallel()
	cfg := testConfig()
	cfg.DefaultLimits = RateLimits{RPM: 1, TPM: 6000}
	tests := []struct {
		name       string
		overrun    int64 // tokens settled beyond the first reservation
		wantBucket string
		wantRetry  time.Duration
	}{
		// RPM is empty for 60s; TPM, 3000 tokens down, could cover 100 tokens at once.
		{"RPM waits longer", 0, "tenant:acme:rpm", time.Minute},
		// An overrun of 9000 leaves TPM 120s in debt: 100 tokens more fit after 61s.
		{"TPM waits longer", 9000, "tenant:acme:tpm", 61 * time.Second},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			f := newFixture(t, cfg)
			first := f.reserve(t, "acme", 2900, 100)
			if _, err := f.svc.Settle(context.Background(), SettleRequest{Tenant: "acme", ReservationID: first.ReservationID, Usage: &Usage{TotalTokens: 3000 + tt.overrun}}); err != nil {
				t.Fatal(err)
			}
			_, err := f.svc.Reserve(context.Background(), ReserveRequest{Tenant: "acme", Model: "m", InputTokens: 99, MaxOutputTokens: 1})
			exhausted, ok := errors.AsType[*ExhaustedError](err)
			if !ok || exhausted.Bucket != tt.wantBucket || exhausted.RetryAfter != tt.wantRetry {
				t.Fatalf("err = %v, want %s exhausted with retry after %v", err, tt.wantBucket, tt.wantRetry)
			}
		})
	}
}

func TestReserveRequestTooLarge(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name      string
		req       ReserveRequest
		wantField string
		wantCost  int64
	}{
		{"max output pushes it over", ReserveRequest{InputTokens: 5950, MaxOutputTokens: 100}, "max_output_tokens", 6050},
		{"input alone is over", ReserveRequest{InputTokens: 6001, MaxOutputTokens: 1}, "input_tokens", 6002},
		{"counted messages are over", ReserveRequest{Messages: []Message{{Role: "user", Content: strings.Repeat("word ", 7000)}}}, "messages", 8857},
		{"huge numbers do not wrap around", ReserveRequest{InputTokens: 1 << 62, MaxOutputTokens: 1 << 62}, "input_tokens", 1<<63 - 1},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			f := newFixture(t, testConfig())
			tt.req.Tenant, tt.req.Model, tt.req.RequestID, tt.req.Priority = "acme", "gpt-4o", "req-1", mantlev1.Priority_PRIORITY_BATCH

			_, err := f.svc.Reserve(context.Background(), tt.req)
			tooLarge, ok := errors.AsType[*TooLargeError](err)
			if !ok || !errors.Is(err, ErrRequestTooLarge) {
				t.Fatalf("err = %v, want *TooLargeError", err)
			}
			want := TooLargeError{Bucket: "tenant:acme:tpm", Field: tt.wantField, Cost: tt.wantCost, Limit: 6000}
			if diff := cmp.Diff(want, *tooLarge); diff != "" {
				t.Errorf("refusal mismatch (-want +got):\n%s", diff)
			}
			events := f.events.rejections(t)
			if len(events) != 1 {
				t.Fatalf("published %d rejection events, want 1", len(events))
			}
			ev := events[0]
			if ev.GetReason() != "REQUEST_TOO_LARGE" || ev.GetBucket() != "tenant:acme:tpm" || ev.GetRetryAfter() != nil ||
				ev.GetTenant() != "acme" || ev.GetRequestId() != "req-1" || ev.GetModel() != "gpt-4o" ||
				ev.GetPriority() != mantlev1.Priority_PRIORITY_BATCH || !ev.GetAt().AsTime().Equal(t0) {
				t.Errorf("event = %v", ev)
			}
			if got := f.counter(t, "mantle_quota_decisions_total", "result", "too_large"); got != 1 {
				t.Errorf("too_large decisions = %v, want 1", got)
			}
			// Nothing was charged: the whole bucket is still there.
			if got := f.reserve(t, "acme", 5999, 1); got.Levels.Requests.Remaining != 59 {
				t.Errorf("remaining requests = %d, want 59", got.Levels.Requests.Remaining)
			}
		})
	}
}

func TestReserveExhaustedPublishesEventAndCounts(t *testing.T) {
	t.Parallel()
	f := newFixture(t, testConfig())
	f.reserve(t, "acme", 5999, 1)
	_, err := f.svc.Reserve(context.Background(), ReserveRequest{Tenant: "acme", RequestID: "req-2", Model: "qwen-max", InputTokens: 99, MaxOutputTokens: 1})
	if !errors.Is(err, ErrExhausted) {
		t.Fatalf("err = %v, want ErrExhausted", err)
	}
	events := f.events.rejections(t)
	if len(events) != 1 {
		t.Fatalf("published %d rejection events, want 1", len(events))
	}
	if ev := events[0]; ev.GetReason() != "QUOTA_EXHAUSTED" || ev.GetBucket() != "tenant:acme:tpm" ||
		ev.GetRetryAfter().AsDuration() != time.Second || ev.GetRequestId() != "req-2" || ev.GetModel() != "qwen-max" {
		t.Errorf("event = %v", ev)
	}
	for result, want := range map[string]float64{"granted": 1, "exhausted": 1, "too_large": 0} {
		if got := f.counter(t, "mantle_quota_decisions_total", "result", result); got != want {
			t.Errorf("decisions{result=%s} = %v, want %v", result, got, want)
		}
	}
	if got := f.counter(t, "mantle_quota_reserved_tokens_total"); got != 6000 {
		t.Errorf("reserved tokens = %v, want 6000", got)
	}
}

func TestSettle(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name          string
		advance       time.Duration // between reserve and settle
		usage         Usage
		wantRefunded  int64
		wantRemaining int64
		wantReset     time.Duration
	}{
		{"unused estimate is refunded", 0, Usage{TotalTokens: 400}, 600, 5600, 4 * time.Second},
		{"exact estimate changes nothing", 0, Usage{InputTokens: 900, OutputTokens: 100}, 0, 5000, 10 * time.Second},
		{"overrun is charged", 0, Usage{TotalTokens: 2500}, -1500, 3500, 25 * time.Second},
		{"total wins over its parts", 0, Usage{InputTokens: 1, OutputTokens: 1, TotalTokens: 700}, 300, 5300, 7 * time.Second},
		{"overdraft goes below zero", 0, Usage{TotalTokens: 9000}, -8000, 0, 90 * time.Second},
		{"refund stops at capacity", time.Minute, Usage{}, 1000, 6000, 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			f := newFixture(t, testConfig())
			r := f.reserve(t, "acme", 900, 100)
			f.clock.Advance(tt.advance)
			got, err := f.svc.Settle(context.Background(), SettleRequest{Tenant: "acme", ReservationID: r.ReservationID, Usage: &tt.usage})
			if err != nil {
				t.Fatal(err)
			}
			if got.Refunded != tt.wantRefunded || got.Levels.Tokens.Remaining != tt.wantRemaining || got.Levels.Tokens.Reset != tt.wantReset {
				t.Errorf("refunded %d, remaining %d, reset %v; want %d, %d, %v",
					got.Refunded, got.Levels.Tokens.Remaining, got.Levels.Tokens.Reset, tt.wantRefunded, tt.wantRemaining, tt.wantReset)
			}
			// The request itself stays counted.
			if want := int64(59) + int64(tt.advance/time.Second); got.Levels.Requests.Remaining != min(want, 60) {
				t.Errorf("remaining requests = %d, want %d", got.Levels.Requests.Remaining, min(want, 60))
			}
		})
	}
}

func TestSettleOverdraftDelaysNextReservation(t *testing.T) {
	t.Parallel()
	f := newFixture(t, testConfig())
	r := f.reserve(t, "acme", 900, 100)
	if _, err := f.svc.Settle(context.Background(), SettleRequest{Tenant: "acme", ReservationID: r.ReservationID, Usage: &Usage{TotalTokens: 9000}}); err != nil {
		t.Fatal(err)
	}
	// 90s of debt, minus the 60s a full bucket spans, plus 1s for 100 tokens.
	_, err := f.svc.Reserve(context.Background(), ReserveRequest{Tenant: "acme", Model: "m", InputTokens: 99, MaxOutputTokens: 1})
	if exhausted, ok := errors.AsType[*ExhaustedError](err); !ok || exhausted.RetryAfter != 31*time.Second {
		t.Fatalf("err = %v, want exhausted with retry after 31s", err)
	}
}

func TestSettleTwiceIsNotFound(t *testing.T) {
	t.Parallel()
	f := newFixture(t, testConfig())
	r := f.reserve(t, "acme", 900, 100)
	f.reserve(t, "acme", 4900, 100) // drains the rest of the bucket
	req := SettleRequest{Tenant: "acme", ReservationID: r.ReservationID, Usage: &Usage{}}

	first, err := f.svc.Settle(context.Background(), req)
	if err != nil {
		t.Fatal(err)
	}
	if first.Refunded != 1000 || first.Levels.Tokens.Remaining != 1000 {
		t.Fatalf("first settle: refunded %d, remaining %d; want 1000, 1000", first.Refunded, first.Levels.Tokens.Remaining)
	}
	if _, err := f.svc.Settle(context.Background(), req); !errors.Is(err, ErrReservationNotFound) {
		t.Fatalf("second settle: err = %v, want ErrReservationNotFound", err)
	}
	if got := f.reserve(t, "acme", 999, 1); got.Levels.Tokens.Remaining != 0 {
		t.Errorf("remaining tokens = %d, want 0 (a second refund would have left 1000)", got.Levels.Tokens.Remaining)
	}
}

func TestSettleUnknownReservation(t *testing.T) {
	t.Parallel()
	f := newFixture(t, testConfig())
	_, err := f.svc.Settle(context.Background(), SettleRequest{Tenant: "acme", ReservationID: "no-such-id", Usage: &Usage{}})
	if !errors.Is(err, ErrReservationNotFound) {
		t.Fatalf("err = %v, want ErrReservationNotFound", err)
	}
}

func TestReservationExpiry(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name    string
		advance time.Duration
		wantErr error
	}{
		{"settled just before the TTL", 2*time.Minute - 1, nil},
		{"settled at the TTL", 2 * time.Minute, ErrReservationNotFound},
		{"settled long after", time.Hour, ErrReservationNotFound},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			f := newFixture(t, testConfig())
			r := f.reserve(t, "acme", 900, 100)
			f.clock.Advance(tt.advance)
			_, err := f.svc.Settle(context.Background(), SettleRequest{Tenant: "acme", ReservationID: r.ReservationID, Usage: &Usage{}})
			if !errors.Is(err, tt.wantErr) {
				t.Fatalf("err = %v, want %v", err, tt.wantErr)
			}
			if n := f.store.openReservations(); n != 0 {
				t.Errorf("store holds %d reservations after the settle attempt, want 0", n)
			}
		})
	}
}

func TestSweeperDeletesExpiredReservations(t *testing.T) {
	t.Parallel()
	clock := clockwork.NewFakeClockAt(t0)
	memory := NewMemoryStore()
	store := &sweepSignallingStore{Store: memory, swept: make(chan int)}
	reg := prometheus.NewRegistry()
	svc, err := NewService(testConfig(), Deps{Store: store, Clock: clock, Metrics: reg, Log: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	f := &fixture{svc: svc, store: memory, clock: clock, reg: reg}

	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- svc.Run(ctx) }()
	if err := clock.BlockUntilContext(ctx, 1); err != nil { // the sweeper's ticker exists
		t.Fatal(err)
	}
	f.reserve(t, "acme", 900, 100) // expires at 2m

	// The sweeper ticks every 30s. Advancing one tick at a time and waiting for its
	// sweep keeps every step deterministic.
	steps := []struct {
		at           time.Duration
		wantRemoved  int
		wantOpen     int
		reserveAfter bool // expires 2m later
	}{
		{30 * time.Second, 0, 1, false},
		{time.Minute, 0, 1, true},
		{90 * time.Second, 0, 2, false},
		{2 * time.Minute, 1, 1, false},
		{150 * time.Second, 0, 1, false},
		{3 * time.Minute, 1, 0, false},
	}
	for _, s := range steps {
		clock.Advance(30 * time.Second)
		select {
		case n := <-store.swept:
			if n != s.wantRemoved {
				t.Errorf("sweep at %v removed %d, want %d", s.at, n, s.wantRemoved)
			}
		case <-time.After(10 * time.Second): // a failure timeout, not a wait
			t.Fatalf("sweeper did not run at %v", s.at)
		}
		if got := memory.openReservations(); got != s.wantOpen {
			t.Errorf("after the sweep at %v: %d open reservations, want %d", s.at, got, s.wantOpen)
		}
		if s.reserveAfter {
			f.reserve(t, "acme", 900, 100)
		}
	}
	cancel()
	if err := <-done; err != nil {
		t.Errorf("Run returned %v, want nil on cancel", err)
	}
	if got := f.counter(t, "mantle_quota_expired_reservations_total"); got != 2 {
		t.Errorf("expired reservations = %v, want 2", got)
	}
}

func TestTenantIsolation(t *testing.T) {
	t.Parallel()
	cfg := testConfig()
	cfg.Tenants = map[string]RateLimits{"big": {TPM: 12_000}}
	f := newFixture(t, cfg)

	acme := f.reserve(t, "acme", 5999, 1)
	if _, err := f.svc.Reserve(context.Background(), ReserveRequest{Tenant: "acme", Model: "m", InputTokens: 1, MaxOutputTokens: 1}); !errors.Is(err, ErrExhausted) {
		t.Fatalf("acme: err = %v, want ErrExhausted", err)
	}

	t.Run("another tenant has its own buckets", func(t *testing.T) {
		got := f.reserve(t, "beta", 999, 1)
		if got.Levels.Tokens.Remaining != 5000 || got.Levels.Requests.Remaining != 59 {
			t.Errorf("beta remaining tokens, requests = %d, %d; want 5000, 59", got.Levels.Tokens.Remaining, got.Levels.Requests.Remaining)
		}
	})
	t.Run("an override applies to its tenant only", func(t *testing.T) {
		got := f.reserve(t, "big", 9999, 1)
		if got.Levels.Tokens.Limit != 12_000 || got.Levels.Tokens.Remaining != 2000 || got.Levels.Requests.Limit != 60 {
			t.Errorf("big limits = %+v, want 12000 tokens (2000 left) and the default 60 requests", got.Levels)
		}
	})
	t.Run("another tenant cannot settle the reservation", func(t *testing.T) {
		_, err := f.svc.Settle(context.Background(), SettleRequest{Tenant: "beta", ReservationID: acme.ReservationID, Usage: &Usage{}})
		if !errors.Is(err, ErrReservationNotFound) {
			t.Fatalf("beta settling acme's reservation: err = %v, want ErrReservationNotFound", err)
		}
		// ... and trying did not destroy it.
		got, err := f.svc.Settle(context.Background(), SettleRequest{Tenant: "acme", ReservationID: acme.ReservationID, Usage: &Usage{}})
		if err != nil || got.Refunded != 6000 {
			t.Fatalf("acme settling its own: refunded %d, err %v; want 6000, nil", got.Refunded, err)
		}
	})
}

func TestReserveIsAtomicUnderConcurrency(t *testing.T) {
	t.Parallel()
	cfg := testConfig()
	cfg.DefaultLimits = RateLimits{RPM: 100, TPM: 1_000_000}
	f := newFixture(t, cfg)
	var (
		wg      sync.WaitGroup
		mu      sync.Mutex
		granted int
	)
	for range 250 {
		wg.Go(func() {
			_, err := f.svc.Reserve(context.Background(), ReserveRequest{Tenant: "acme", Model: "m", InputTokens: 10, MaxOutputTokens: 10})
			if err == nil {
				mu.Lock()
				granted++
				mu.Unlock()
			} else if !errors.Is(err, ErrExhausted) {
				t.Errorf("unexpected error: %v", err)
			}
		})
	}
	wg.Wait()
	if granted != 100 {
		t.Errorf("granted %d of 250 concurrent requests, want exactly the 100 RPM allows", granted)
	}
}

func TestReserveValidation(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name       string
		req        ReserveRequest
		wantFields []string
	}{
		{"valid", ReserveRequest{Tenant: "acme", Model: "m"}, nil},
		{"no tenant", ReserveRequest{Model: "m"}, []string{"quality.tenant"}},
		{"no model", ReserveRequest{Tenant: "acme"}, []string{"model"}},
		{"negative counts", ReserveRequest{Tenant: "acme", Model: "m", InputTokens: -1, MaxOutputTokens: -2}, []string{"input_tokens", "max_output_tokens"}},
		{"everything wrong", ReserveRequest{InputTokens: -1}, []string{"quality.tenant", "model", "input_tokens"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			f := newFixture(t, testConfig())
			_, err := f.svc.Reserve(context.Background(), tt.req)
			if got := violationFields(err); !slices.Equal(got, tt.wantFields) {
				t.Errorf("invalid fields = %v, want %v (err %v)", got, tt.wantFields, err)
			}
			if tt.wantFields != nil && len(f.events.rejections(t)) != 0 {
				t.Error("an invalid request published a rejection event; only quota refusals should")
			}
		})
	}
}

func TestSettleValidation(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name       string
		req        SettleRequest
		wantFields []string
	}{
		{"no usage", SettleRequest{Tenant: "acme", ReservationID: "r"}, []string{"usage"}},
		{"no reservation id", SettleRequest{Tenant: "acme", Usage: &Usage{}}, []string{"reservation_id"}},
		{"no tenant", SettleRequest{ReservationID: "r", Usage: &Usage{}}, []string{"quality.tenant"}},
		{"negative usage", SettleRequest{Tenant: "acme", ReservationID: "r", Usage: &Usage{InputTokens: -1, OutputTokens: -1, TotalTokens: -1}},
			[]string{"usage.input_tokens", "usage.output_tokens", "usage.total_tokens"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			f := newFixture(t, testConfig())
			_, err := f.svc.Settle(context.Background(), tt.req)
			if got := violationFields(err); !slices.Equal(got, tt.wantFields) {
				t.Errorf("invalid fields = %v, want %v (err %v)", got, tt.wantFields, err)
			}
		})
	}
}

func violationFields(err error) []string {
	v, ok := errors.AsType[*rpc.ValidationError](err)
	if !ok {
		return nil
	}
	var fields []string
	for _, fv := range v.Violations {
		fields = append(fields, fv.Field)
	}
	return fields
}

func TestServiceCountTokens(t *testing.T) {
	t.Parallel()
	f := newFixture(t, testConfig())
	tests := []struct {
		name      string
		model     string
		messages  []Message
		text      string
		want      TokenCount
		wantField string
	}{
		{"text", "gpt-4", nil, "the cat sat on the mat", TokenCount{Tokens: 6, Tokenizer: "estimate/cl100k-like"}, ""},
		{"messages", "qwen-plus", []Message{{Role: "user", Content: "你好世界"}}, "", TokenCount{Tokens: 3 + 4 + 3, Tokenizer: "estimate/zh-optimized"}, ""},
		{"no model uses the default", "", nil, "hi", TokenCount{Tokens: 1, Tokenizer: "estimate/cl100k-like"}, ""},
		{"nothing to count", "gpt-4", nil, "", TokenCount{}, "messages"},
		{"both", "gpt-4", []Message{{Role: "user", Content: "hi"}}, "hi", TokenCount{}, "text"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			got, err := f.svc.CountTokens(context.Background(), tt.model, tt.messages, tt.text)
			if fields := violationFields(err); tt.wantField != "" && !slices.Equal(fields, []string{tt.wantField}) {
				t.Fatalf("err = %v, want a violation of %s", err, tt.wantField)
			}
			if tt.wantField == "" && err != nil {
				t.Fatal(err)
			}
			if diff := cmp.Diff(tt.want, got); diff != "" {
				t.Errorf("count mismatch (-want +got):\n%s", diff)
			}
		})
	}
}

func TestNewServiceRejectsBadInput(t *testing.T) {
	t.Parallel()
	valid := Deps{Store: NewMemoryStore(), Clock: clockwork.NewFakeClock(), Metrics: prometheus.NewRegistry(), Log: slog.New(slog.DiscardHandler)}
	bad := DefaultConfig()
	bad.DefaultLimits.RPM = -1
	if _, err := NewService(bad, valid); err == nil || !strings.Contains(err.Error(), "default_limits.rpm") {
		t.Errorf("invalid config: err = %v, want it to name default_limits.rpm", err)
	}
	noStore := valid
	noStore.Store = nil
	if _, err := NewService(DefaultConfig(), noStore); err == nil {
		t.Error("missing Store: err = nil, want an error")
	}
	// The same registry twice means two services would export the same series.
	if _, err := NewService(DefaultConfig(), valid); err != nil {
		t.Fatal(err)
	}
	if _, err := NewService(DefaultConfig(), valid); err == nil {
		t.Error("registering metrics twice: err = nil, want an error")
	}
}

func BenchmarkReserveSettle(b *testing.B) {
	cfg := DefaultConfig()
	cfg.DefaultLimits = RateLimits{RPM: 1 << 40, TPM: 1 << 50} // never refuse: measure the happy path
	f := newFixture(b, cfg)
	ctx := context.Background()
	tenants := make([]string, 64)
	for i := range tenants {
		tenants[i] = fmt.Sprintf("tenant-%d", i)
	}
	b.ReportAllocs()
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		i := 0
		for pb.Next() {
			tenant := tenants[i%len(tenants)]
			i++
			r, err := f.svc.Reserve(ctx, ReserveRequest{Tenant: tenant, Model: "gpt-4o", InputTokens: 500, MaxOutputTokens: 1024})
			if err != nil {
				b.Fatal(err)
			}
			if _, err := f.svc.Settle(ctx, SettleRequest{Tenant: tenant, ReservationID: r.ReservationID, Usage: &Usage{TotalTokens: 800}}); err != nil {
				b.Fatal(err)
			}
		}
	})
}
